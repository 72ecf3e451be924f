"""engine_native.torch basics and collectives at size 1, on the fake core (no build needed).

What the torch layer hands the core (names, op codes, scales, roots) is asserted from the
fake's log; results are checked against plain torch.
"""
import importlib.util
import json
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
          torch.bfloat16, torch.float32, torch.float64, torch.bool]
NOT_INIT = 'Horovod has not been initialized; use hvd.init().'


def last_op(hvd):
    return hvd.core.state['log'][-1]


def test_fake_core_round_trip(fake):
    hvd, core = fake
    hvd.init()
    t = torch.arange(4, dtype=torch.float32)
    h = hvd.allreduce_async(t, name='x', op=hvd.Sum, prescale_factor=2.0)
    assert hvd.poll(h) is False
    assert torch.equal(hvd.synchronize(h), t * 2)
    assert core.state['log'][-1][1] == 'allreduce.x'
    hvd.shutdown()


def test_queries_before_init_raise_horovods_value_error(fake):
    hvd, _ = fake
    assert hvd.is_initialized() is False
    for fn in (hvd.size, hvd.rank, hvd.local_size, hvd.local_rank, hvd.cross_size,
               hvd.cross_rank):
        with pytest.raises(ValueError, match='^' + re.escape(NOT_INIT) + '$'):
            fn()


def test_init_shutdown_reinit(fake):
    hvd, _ = fake
    hvd.init()
    assert hvd.is_initialized() and hvd.size() == 1 and hvd.rank() == 0
    assert (hvd.local_size(), hvd.local_rank(), hvd.cross_size(), hvd.cross_rank()) == (1, 0, 1, 0)
    hvd.init()  # no-op
    hvd.shutdown()
    assert not hvd.is_initialized()
    hvd.init(process_sets='dynamic')
    assert hvd.size() == 1
    assert torch.equal(hvd.allreduce(torch.ones(2), name='again'), torch.ones(2))
    hvd.shutdown()
    with pytest.raises(ValueError):
        hvd.init(process_sets='static')


def test_build_queries_answer_for_this_core(hvd, monkeypatch):
    # mpi_built: mpi4py importable (tests/mpi/test_mpi_queries.py checks mpiexec launches).
    assert hvd.mpi_built() is (importlib.util.find_spec('mpi4py') is not None)
    assert hvd.mpi_enabled() is False  # a world of one, not started by mpiexec
    assert hvd.gloo_built() is False and hvd.gloo_enabled() is False
    assert hvd.nccl_built() == 0 and isinstance(hvd.nccl_built(), int)
    assert hvd.ddl_built() is False and hvd.ccl_built() is False
    assert hvd.cuda_built() is False and hvd.rocm_built() is False
    with pytest.raises(ValueError, match='MPI is not enabled'):
        hvd.mpi_threads_supported()
    assert (hvd.Average, hvd.Sum, hvd.Adasum, hvd.Min, hvd.Max, hvd.Product) == (0, 1, 2, 3, 4, 5)
    assert issubclass(hvd.HorovodInternalError, RuntimeError)
    monkeypatch.setitem(sys.modules, 'mpi4py', None)  # how Python marks "not importable"
    assert hvd.mpi_built() is False


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
def test_allreduce_every_dtype(hvd, dtype):
    t = (torch.arange(12) % 3).to(dtype).reshape(3, 4)
    op = hvd.Sum if dtype == torch.bool else hvd.Average
    out = hvd.allreduce(t, name='x', op=op)
    assert out.dtype == dtype and out.shape == t.shape and torch.equal(out, t)
    assert out.data_ptr() != t.data_ptr()
    kind, name, code, shape, *_ = last_op(hvd)
    assert (kind, name, code, shape) == (0, 'allreduce.x', DTYPES.index(dtype), (3, 4))


def test_allreduce_passes_op_and_scales_to_core(hvd):
    t = torch.ones(5)
    out = hvd.allreduce(t, op=hvd.Max, prescale_factor=2.0, postscale_factor=3.0)
    op = last_op(hvd)
    assert op[6:9] == (hvd.Max, 2.0, 3.0) and op[10] == 0
    assert torch.equal(out, t * 6)


def test_noname_counter_and_prefixes(hvd):
    hvd.allreduce(torch.ones(1))
    hvd.allgather(torch.ones(1))
    hvd.broadcast(torch.ones(1), 0)
    hvd.allreduce(torch.ones(1), name='w')
    hvd.allreduce(torch.ones(1))
    names = [op[1] for op in hvd.core.state['log']]
    assert names == ['allreduce.noname.0', 'allgather.noname.1', 'broadcast.noname.2',
                     'allreduce.w', 'allreduce.noname.3']


def test_synchronous_forms_let_their_wait_drive_the_op(hvd):
    # Note [Caller drives]: a sync call's op is enqueued without waking the core's thread;
    # an async call's is not (its caller goes on computing while the core works).
    t = torch.ones(3)
    hvd.allreduce(t, name='s1')
    hvd.allreduce_(t, name='s2')
    hvd.broadcast_(t, 0, name='s3')
    hvd.broadcast(t, 0, name='s4')
    hvd.synchronize(hvd.allreduce_async(t, name='a1'))
    hvd.synchronize(hvd.allreduce_async_(t, name='a2'))
    hvd.synchronize(hvd.broadcast_async_(t, 0, name='a3'))
    # Groups too: every member of a blocking group is enqueued for its caller's wait.
    hvd.grouped_allreduce([t, t], name='g1')
    hvd.grouped_allreduce_([t.clone(), t.clone()], name='g2')
    hvd.grouped_allgather([t, t], name='g3')
    hvd.grouped_reducescatter([t, t], name='g4')
    # and their autograd forwards
    w = torch.ones(3, requires_grad=True)
    hvd.grouped_allreduce([w, w], name='g5')
    hvd.grouped_allgather([w, w], name='g6')
    hvd.grouped_reducescatter([w, w], name='g7')
    hvd.synchronize(hvd.grouped_allreduce_async([t, t], name='ga1'))
    hvd.synchronize(hvd.grouped_allgather_async([t, t], name='ga2'))
    groups = {'%s.%s_%dof2' % (prefix, name, i) for prefix, name in [
        ('grouped_allreduce', 'g1'), ('grouped_allreduce', 'g2'), ('grouped_allgather', 'g3'),
        ('grouped_reducescatter', 'g4'), ('grouped_allreduce', 'g5'), ('grouped_allgather', 'g6'),
        ('grouped_reducescatter', 'g7')] for i in (1, 2)}
    assert hvd.core.state['waited'] == {'allreduce.s1', 'allreduce.s2', 'broadcast.s3',
                                        'broadcast.s4'} | groups


def test_inplace_and_async_variants(hvd):
    t = torch.arange(6, dtype=torch.float64)
    assert hvd.allreduce_(t, op=hvd.Sum, postscale_factor=2.0) is t
    assert torch.equal(t, torch.arange(6, dtype=torch.float64) * 2)
    h = hvd.allreduce_async_(t, name='t', op=hvd.Sum)
    assert hvd.poll(h) is False  # the fake completes only when polled again or waited
    assert hvd.poll(h) is True
    assert hvd.synchronize(h) is t
    assert hvd.synchronize(h) is None  # already synchronized: Horovod returns None
    with pytest.raises(ValueError, match='was not created or has been cleared'):
        hvd.poll(h)


def test_async_keeps_input_alive(hvd):
    h = hvd.allreduce_async(torch.full((1000,), 7.0), name='tmp', op=hvd.Sum)
    import gc
    gc.collect()
    assert torch.equal(hvd.synchronize(h), torch.full((1000,), 7.0))


def test_grouped_allreduce_variants(hvd):
    ts = [torch.ones(3), torch.arange(4.0)]
    outs = hvd.grouped_allreduce(ts, name='g', op=hvd.Sum)
    assert [torch.equal(o, t) for o, t in zip(outs, ts)] == [True, True]
    names = [op[1] for op in hvd.core.state['log'][-2:]]
    assert names == ['grouped_allreduce.g_1of2', 'grouped_allreduce.g_2of2']
    res = hvd.grouped_allreduce_(ts, op=hvd.Sum)
    assert res[0] is ts[0] and res[1] is ts[1]
    h = hvd.grouped_allreduce_async(ts)
    assert isinstance(hvd.synchronize(h), list)
    with pytest.raises(ValueError):
        hvd.grouped_allreduce([])


def test_average_is_deprecated_and_exclusive_with_op(hvd):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter('always')
        hvd.allreduce(torch.ones(2), average=False)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught)
    assert last_op(hvd)[6] == hvd.Sum
    with pytest.raises(ValueError, match='supersedes average'):
        hvd.allreduce(torch.ones(2), average=True, op=hvd.Sum)
    with pytest.raises(ValueError, match='supersedes average'):
        hvd.allreduce_async_(torch.ones(2), average=True, op=hvd.Sum)


def test_bad_arguments(hvd):
    hvd.allreduce(torch.ones(2), op=hvd.Adasum)  # Adasum reaches the core (issue #18)
    assert last_op(hvd)[6] == hvd.Adasum
    with pytest.raises(ValueError, match='unknown reduce op'):
        hvd.allreduce(torch.ones(2), op=42)
    with pytest.raises(ValueError, match='contiguous'):
        hvd.allreduce(torch.ones(4, 4).t(), name='nc')
    with pytest.raises(ValueError, match='not supported'):
        hvd.allreduce(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match='meta'):
        hvd.allgather(torch.empty(2, device='meta'))
    with pytest.raises(ValueError, match='dense'):
        hvd.allreduce(torch.ones(2).to_sparse())
    with pytest.raises(TypeError):
        hvd.allreduce_async([1.0, 2.0])
    with pytest.raises(TypeError, match='Average'):
        hvd.allreduce(torch.ones(2, dtype=torch.bool))  # core: Average cannot reduce bool
    assert hvd.core.state['names'] == set()


def test_cuda_tensor_without_a_cuda_runtime_is_a_clear_error_and_join_is_on_the_cpu(hvd):
    class CudaLike(torch.Tensor):
        @property
        def device(self):
            return torch.device('cuda', 0)
    t = torch.Tensor._make_subclass(CudaLike, torch.ones(2))
    for fn in (hvd.allreduce_async, hvd.allgather_async, hvd.alltoall_async):
        with pytest.raises(RuntimeError, match='the CUDA runtime was not found'):
            fn(t)
    assert hvd.core.state['log'] == []  # nothing reached the core
    # A join names no tensor: without a CUDA runtime join(device=0) joins on the CPU, as
    # Horovod built without GPU support does (Note [join's device without CUDA]).
    assert hvd.join(0) == 0 and last_op(hvd)[1] == 'join' and last_op(hvd)[12] == -1


def test_duplicate_name_in_flight_is_value_error(hvd):
    h = hvd.allreduce_async(torch.ones(2), name='dup')
    with pytest.raises(ValueError, match='Duplicate'):
        hvd.allreduce_async(torch.ones(2), name='dup')
    hvd.synchronize(h)


def test_core_failure_becomes_horovod_internal_error(hvd):
    h = hvd.allreduce_async(torch.ones(2), name='fail')
    core_handle = max(hvd.core.state['handles'])
    hvd.core.state['handles'][core_handle]['error'] = RuntimeError('peer 1 lost (tcp)')
    with pytest.raises(hvd.HorovodInternalError, match='peer 1 lost'):
        hvd.synchronize(h)
    assert hvd.synchronize(h) is None


@pytest.mark.parametrize('rows', [0, 1, 5])
def test_allgather_and_grouped(hvd, rows):
    t = torch.arange(rows * 3, dtype=torch.int32).reshape(rows, 3)
    out = hvd.allgather(t, name='ag')
    assert out.dtype == torch.int32 and torch.equal(out, t)
    assert last_op(hvd)[:2] == (1, 'allgather.ag')
    outs = hvd.grouped_allgather([t, t.double()], name='gag')
    assert torch.equal(outs[0], t) and torch.equal(outs[1], t.double())
    h = hvd.allgather_async(t)
    assert torch.equal(hvd.synchronize(h), t)


def test_broadcast_variants(hvd):
    t = torch.arange(4.0)
    out = hvd.broadcast(t, root_rank=0, name='b')
    assert torch.equal(out, t) and out.data_ptr() != t.data_ptr()
    assert last_op(hvd)[1] == 'broadcast.b' and last_op(hvd)[9] == 0
    assert hvd.broadcast_(t, 0) is t
    assert torch.equal(hvd.synchronize(hvd.broadcast_async(t, 0)), t)
    assert hvd.synchronize(hvd.broadcast_async_(t, 0)) is t
    with pytest.raises(ValueError, match='root'):
        hvd.broadcast(t, root_rank=1)


def test_alltoall_variants_and_split_errors(hvd):
    t = torch.arange(8.0).reshape(4, 2)
    out = hvd.alltoall(t, name='a2a')
    assert torch.equal(out, t)
    assert last_op(hvd)[11] is None
    out, recv = hvd.alltoall(t, splits=[4])
    assert torch.equal(out, t) and recv.dtype == torch.int32 and recv.tolist() == [4]
    out, recv = hvd.alltoall(t, splits=torch.tensor([4], dtype=torch.int64))
    assert last_op(hvd)[11] == [4]
    out, recv = hvd.synchronize(hvd.alltoall_async(t))
    assert recv.tolist() == [4]
    for bad in ([2, 2], [5], [-1], torch.tensor([[4]]), torch.tensor([4.0]), 'ab'):
        with pytest.raises(ValueError):
            hvd.alltoall(t, splits=bad)


def test_reducescatter_variants(hvd):
    t = torch.arange(6.0).reshape(3, 2)
    assert torch.equal(hvd.reducescatter(t, name='rs'), t)
    assert last_op(hvd)[:2] == (4, 'reducescatter.rs') and last_op(hvd)[6] == hvd.Average
    out = hvd.reducescatter(t, op=hvd.Sum, prescale_factor=2.0)
    assert torch.equal(out, 2 * t)
    outs = hvd.grouped_reducescatter([t, t + 1], op=hvd.Sum)
    assert torch.equal(outs[1], t + 1)
    assert torch.equal(hvd.synchronize(hvd.reducescatter_async(t)), t)
    assert len(hvd.synchronize(hvd.grouped_reducescatter_async([t, t]))) == 2
    with pytest.raises(hvd.HorovodInternalError, match='Average or hvd.Sum'):
        hvd.reducescatter(t, op=hvd.Max)


def test_join_barrier_and_process_sets(hvd):
    assert hvd.join() == 0
    hvd.barrier()
    ps = hvd.add_process_set([0])
    assert ps.process_set_id >= 1 and ps.size() == 1 and ps.rank() == 0 and ps.included()
    out = hvd.allreduce(torch.ones(2), name='ps', process_set=ps)
    assert torch.equal(out, torch.ones(2)) and last_op(hvd)[10] == ps.process_set_id
    hvd.barrier(process_set=ps)
    assert hvd.remove_process_set(ps) is True
    with pytest.raises(ValueError, match='process_set'):
        hvd.allreduce(torch.ones(2), process_set=ps)
    assert hvd.global_process_set.process_set_id == 0


_TIMELINE_SCRIPT = """
import sys, torch
import engine_native.torch as hvd
hvd.init()
hvd.start_timeline(sys.argv[1])
hvd.allreduce(torch.ones(4), name='traced')
hvd.stop_timeline()
hvd.shutdown()
"""


def test_timeline_writes_the_file_through_the_torch_api(tmp_path):
    """start_timeline/stop_timeline of engine_native.torch reach the real core (size 1, in a
    fresh process: the core's thread stays out of this one), which writes the trace."""
    path = tmp_path / 't.json'
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(('HVD_', 'HOROVOD_', 'OMPI_', 'PMI'))}
    proc = subprocess.run([sys.executable, '-c', _TIMELINE_SCRIPT, str(path)], env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    events = json.loads(path.read_text())  # stop_timeline left valid JSON
    tracks = {e['pid']: e['args']['name'] for e in events
              if e.get('ph') == 'M' and e.get('name') == 'process_name'}
    traced = [pid for pid, name in tracks.items() if 'traced' in name]
    assert traced, f'no track for the traced tensor among {sorted(tracks.values())}'
    spans = [e['name'] for e in events if e.get('pid') in traced and e.get('ph') == 'B']
    assert 'ALLREDUCE' in spans, spans


def test_horovod_names_exported(fake):
    hvd, _ = fake
    names = """init shutdown is_initialized start_timeline stop_timeline size local_size
    cross_size rank local_rank cross_rank mpi_threads_supported mpi_enabled mpi_built
    gloo_enabled gloo_built nccl_built ddl_built ccl_built cuda_built rocm_built allreduce
    allreduce_async allreduce_ allreduce_async_ grouped_allreduce grouped_allreduce_async
    grouped_allreduce_ grouped_allreduce_async_ sparse_allreduce_async allgather
    allgather_async grouped_allgather grouped_allgather_async broadcast broadcast_async
    broadcast_ broadcast_async_ alltoall alltoall_async reducescatter reducescatter_async
    grouped_reducescatter grouped_reducescatter_async join barrier poll synchronize ProcessSet
    global_process_set add_process_set remove_process_set Average Sum Adasum Min Max Product
    HorovodInternalError DistributedOptimizer SyncBatchNorm Compression allgather_object
    broadcast_object broadcast_optimizer_state broadcast_parameters elastic""".split()
    assert [n for n in names if not hasattr(hvd, n)] == []
    from engine_native.torch import mpi_ops
    assert mpi_ops.Sum == 1 and mpi_ops.allreduce is hvd.allreduce


def test_collective_before_init_is_horovod_internal_error(fake):
    hvd, _ = fake
    with pytest.raises(hvd.HorovodInternalError, match='not been initialized'):
        hvd.allreduce(torch.ones(2))
    with pytest.raises(hvd.HorovodInternalError, match='not been initialized'):
        hvd.barrier()
