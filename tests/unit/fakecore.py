"""A single-rank stand-in for ``engine_native._core``, for unit tests of the torch layer.

It follows the binding contract of ``engine_native/_core.pyi`` for one rank: ops complete
lazily (the first ``poll`` says False, ``wait`` executes), so a test sees whether the torch
layer keeps memory alive and waits properly; every enqueue is recorded, so a test can assert
what the torch layer asked of the core (names, ops, scales, roots, splits).

The ``fake`` and ``hvd`` fixtures (tests/unit/conftest.py) swap ``engine_native*`` in
``sys.modules`` for the duration of a test (:func:`fake_engine_native`) and restore the
originals afterwards, so no other test ever sees the fake; :func:`engine_native_on` does the
same for a core a test has altered.
"""
import contextlib
import ctypes
import importlib
import sys
import types

import numpy as np
import torch

_DTYPES = [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.float16,
           torch.bfloat16, torch.float32, torch.float64, torch.bool]
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER, JOIN = range(7)


def _view(ptr, dtype, shape):
    """A tensor over an op's memory: an address (the torch binding's) or an array that owns it
    (the NumPy API's, e.g. engine_native.objects)."""
    if not isinstance(ptr, int):
        import numpy as np
        ptr = np.asarray(ptr).ctypes.data
    numel = 1
    for d in shape:
        numel *= d
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    nbytes = numel * torch.empty((), dtype=dtype).element_size()
    raw = (ctypes.c_char * nbytes).from_address(ptr)
    return torch.frombuffer(raw, dtype=dtype).view(shape)


class HostBuffer(bytearray):
    """A core output Buffer in host memory (the real one says where its memory is)."""
    device = -1


def make_fake_core():
    """A fresh fake ``_core`` module (state is per module object)."""
    core = types.ModuleType('engine_native._core')

    class HorovodInternalError(RuntimeError):
        pass

    state = {'init': False, 'handles': {}, 'waited': set(), 'next': 1, 'sets': {0: [0]},
             'next_set': 1, 'log': [], 'names': set()}
    core.HorovodInternalError = HorovodInternalError
    core.Buffer = HostBuffer
    for i, k in enumerate(['ALLREDUCE', 'ALLGATHER', 'BROADCAST', 'ALLTOALL', 'REDUCESCATTER',
                           'BARRIER', 'JOIN']):
        setattr(core, k, i)
    core.state = state

    def listen(addr):
        return 1

    def process_cpus():
        return "0"

    def init(rank, peers, secret, job_id):
        assert rank == 0 and len(peers) == 1
        state['init'] = True

    def shutdown():  # a restarted core has no op in flight, so no name is taken
        state['init'] = False
        state['names'].clear()
        for h in list(state['handles']):
            state['handles'][h]['error'] = HorovodInternalError('Horovod has been shut down')

    def execute(op):
        kind, name, code, shape, inp, out, red, pre, post, root, ps, splits, device, stream = op
        dtype = _DTYPES[code]
        shape = tuple(shape)
        if kind in (BARRIER, JOIN):
            return 0 if kind == JOIN else None
        x = _view(inp, dtype, shape).clone()
        if kind in (ALLREDUCE, REDUCESCATTER):
            if dtype.is_floating_point:
                y = (x.double() * pre * post).to(dtype)
            else:
                y = (x.double() * pre * post).trunc().to(dtype) if (pre, post) != (1, 1) else x
        else:
            y = x
        if kind in (ALLREDUCE, BROADCAST):
            _view(out, dtype, shape).copy_(y)
            return None
        data = HostBuffer(y.contiguous().view(torch.uint8).numpy().tobytes()) \
            if y.numel() else HostBuffer()
        if kind == ALLTOALL:
            return data, shape, [shape[0] if shape else 0]
        return data, shape

    def enqueue(kind, name, dtype, shape, input_ptr, output_ptr, reduce_op=1, prescale=1.0,
                postscale=1.0, root=0, process_set=0, splits=None, device=-1, stream=0):
        if not state['init']:
            raise HorovodInternalError('Horovod has not been initialized; use hvd.init().')
        if not 0 <= dtype < 10:
            raise TypeError('bad dtype code %r' % dtype)
        if kind == ALLREDUCE and dtype == 9 and reduce_op == 0:
            raise TypeError('%s: Average is not supported for bool' % name)
        if name in state['names']:
            raise ValueError('Duplicate name %s in flight' % name)
        if process_set not in state['sets']:
            raise ValueError('process set %d is unknown' % process_set)
        if kind == BROADCAST and root != 0:
            raise ValueError('%s: root rank %d out of range' % (name, root))
        if kind == ALLTOALL and splits is not None and (len(splits) != 1 or
                                                        splits[0] != (shape[0] if shape else 0)):
            raise ValueError('%s: bad splits %r' % (name, splits))
        op = (kind, name, dtype, tuple(shape), input_ptr, output_ptr, reduce_op, prescale,
              postscale, root, process_set, splits, device, stream)
        state['log'].append(op)
        state['names'].add(name)
        h = state['next']
        state['next'] += 1
        state['handles'][h] = {'op': op, 'polled': False, 'done': False, 'result': None,
                               'error': None}
        return h

    def enqueue_group(ops, waited=False):
        handles = [enqueue(*op) for op in ops]
        if waited:  # as enqueue_for_wait, for each member
            state['waited'].update(op[1] for op in ops)
        return handles

    def enqueue_for_wait(kind, name, *args, **kwargs):  # the real core leaves its thread asleep
        h = enqueue(kind, name, *args, **kwargs)
        state['waited'].add(name)
        return h

    def _finish(rec):
        if not rec['done'] and rec['error'] is None:
            rec['result'] = execute(rec['op'])
        rec['done'] = True
        state['names'].discard(rec['op'][1])

    def poll(handle, free_name=True):
        if handle not in state['handles']:  # as the core: waited for, or never made
            raise ValueError('poll(): unknown or already released handle %d' % handle)
        rec = state['handles'][handle]
        if not rec['polled']:
            rec['polled'] = True
            return False
        _finish(rec)
        return True

    def wait(handle):
        rec = state['handles'].pop(handle)
        _finish(rec)
        if rec['error'] is not None:
            raise rec['error']
        return rec['result']

    def add_process_set(ranks):
        sid = state['next_set']
        state['next_set'] += 1
        state['sets'][sid] = list(ranks)
        return sid

    def remove_process_set(sid):
        state['sets'].pop(sid, None)

    # The numpy API's entry points (engine_native.numpy_ops configures them at import): the
    # fake has no fast path, so allreduce_async, broadcast_async(_) and the gathers always take
    # numpy_ops' checked path.
    numpy = {}

    def numpy_setup(codes, checked, noname, global_set):
        numpy.update(checked=checked, noname=noname, global_set=global_set)

    def output_like(array):  # the fake keeps no pool
        return np.empty_like(array)

    def allreduce_async(array, op=0, name=None, prescale_factor=1.0, postscale_factor=1.0,
                        process_set=None, *, _waited=False):
        full = 'allreduce.%s' % name if name else numpy['noname']('allreduce', None)
        return numpy['checked'](array, op, full, prescale_factor, postscale_factor,
                                process_set or numpy['global_set'], _waited)

    def numpy_broadcast_setup(checked, checked_in_place):
        numpy.update(broadcast=checked, broadcast_=checked_in_place)

    def broadcast_async(*args, **kwargs):
        return numpy['broadcast'](*args, **kwargs)

    def broadcast_async_(*args, **kwargs):
        return numpy['broadcast_'](*args, **kwargs)

    def numpy_gathers_setup(allgather, alltoall, reducescatter):
        numpy.update(allgather=allgather, alltoall=alltoall, reducescatter=reducescatter)

    def allgather_async(*args, **kwargs):
        return numpy['allgather'](*args, **kwargs)

    def alltoall_async(*args, **kwargs):
        return numpy['alltoall'](*args, **kwargs)

    def reducescatter_async(*args, **kwargs):
        return numpy['reducescatter'](*args, **kwargs)

    def keep(handle, keepalive, output, finish):
        state.setdefault('kept', {})[handle] = (keepalive, output, finish)

    def synchronize(handle):
        result = wait(handle)
        _, output, finish = state.setdefault('kept', {}).pop(handle, (None, None, None))
        return output if finish is None else finish(result)

    def synchronize_group(handles):  # bindings/numpy_group.cc: every wait, then the first error
        results, failure = [], None
        for handle in handles:
            try:
                results.append(synchronize(handle))
            except Exception as exc:  # noqa: BLE001 -- raised after the other waits
                failure = failure or exc
        if failure is not None:
            raise failure
        return results

    def grouped_allreduce_aligned(arrays, op, name, prescale, postscale, process_set, waited):
        return None  # declined: aligned groups take numpy_ops' checked path and are logged

    def aligned_like(arrays):  # one 64-byte aligned buffer, views carved in order
        sizes = [-(-a.nbytes // 64) * 64 for a in arrays]
        raw = np.empty(sum(sizes) + 64, np.uint8)
        offsets = np.cumsum([-raw.ctypes.data % 64] + sizes)
        return [np.ndarray(a.shape, a.dtype, raw, o) for a, o in zip(arrays, offsets)]

    # engine_native.torch's C path (bindings/torch_api.cc): the fake declines every call, so
    # allreduces take the torch layer's checked path and are logged like every other op.
    def torch_setup(tensor_type, parameter_type, strided, codes, op_name):
        pass

    def torch_allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor,
                              set_id, waited):
        return None

    def torch_synchronize(handle):
        return None

    def torch_kept(handle):
        return False

    def torch_release_kept():
        pass

    # The grouped ops' C path (bindings/torch_group.cc): declined too, so groups are logged.
    def torch_group_setup(frombuffer, empty):
        pass

    def torch_group_async(kind, tensors, outputs, name, prefix, grouped, op, prescale,
                          postscale, set_id, waited):
        return None

    def torch_group_wait(handles, slots, dtypes):
        raise AssertionError('torch_group_wait without a torch_group_async handle')

    # The NCCL / CUDA-runtime loaders (bindings/nccl.cc): this fake finds neither library.
    def nccl_load(candidates):
        return {'path': None, 'version': 0, 'version_text': None, 'rejected': [],
                'error': 'NCCL was not found (fake core)'}

    def cuda_runtime_load(candidates):
        return dict(nccl_load(candidates), error='the CUDA runtime was not found (fake core)')

    def nccl_version():
        return 0

    # Timeline and autotune (bindings/timeline_autotune_live.cc): calls are recorded, no file
    # is written (the real core's file is checked in test_torch_api.py).
    def start_timeline(file_path, mark_cycles=False):
        state['timeline'] = (file_path, bool(mark_cycles))

    def stop_timeline():
        state['timeline'] = None

    def timeline_events(since_us=0):
        return []

    def autotune_state():
        return {'enabled': False, 'tuner': False, 'phase': 'off', 'applied_phase': 'off'}

    def set_autotune(enabled):
        state['autotune'] = bool(enabled)

    for fn in (listen, process_cpus, init, shutdown, enqueue, enqueue_group, enqueue_for_wait,
               poll, wait,
               add_process_set, remove_process_set, numpy_setup, output_like, allreduce_async,
               keep,
               numpy_broadcast_setup, broadcast_async, broadcast_async_,
               numpy_gathers_setup, allgather_async, alltoall_async, reducescatter_async,
               synchronize, synchronize_group, grouped_allreduce_aligned, aligned_like,
               torch_setup, torch_allreduce_async, torch_synchronize, torch_kept,
               torch_release_kept, torch_group_setup, torch_group_async, torch_group_wait,
               nccl_load, cuda_runtime_load, nccl_version, start_timeline,
               stop_timeline, timeline_events, autotune_state, set_autotune):
        setattr(core, fn.__name__, fn)
    core.ALIGNMENT = 64
    core.abort = lambda reason: None
    core.is_initialized = lambda: state['init']
    core.rank = lambda: 0
    core.size = lambda: 1
    core.process_set_ranks = lambda sid: state['sets'][sid]
    core.metrics = lambda: {}
    core.config_table = lambda: []
    return core


@contextlib.contextmanager
def engine_native_on(core):
    """``engine_native`` imported afresh on ``core`` inside the block; sys.modules restored
    after."""
    saved = {k: v for k, v in sys.modules.items()
             if k == 'engine_native' or k.startswith('engine_native.')}
    for k in saved:
        del sys.modules[k]
    sys.modules['engine_native._core'] = core
    try:
        yield
    finally:
        for k in [k for k in sys.modules if k == 'engine_native' or
                  k.startswith('engine_native.')]:
            del sys.modules[k]
        sys.modules.update(saved)


@contextlib.contextmanager
def fake_engine_native():
    """Import a fresh ``engine_native.torch`` on a fake core; yield it and the core."""
    core = make_fake_core()
    with engine_native_on(core):
        yield importlib.import_module('engine_native.torch'), core
