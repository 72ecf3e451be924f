"""A mixed process set on the fake device: several GPUs, some shared by several ranks
(Note [Device path choice], E). Its allreduce is hierarchical — CUDA IPC among each GPU's
ranks, NCCL among one leader per GPU, the result handed back over IPC — and must give NumPy's
answers for every dtype, op and scale and for fused batches; its other collectives stage and
stay correct. The path reads "cuda-ipc+nccl" in metrics.
"""
import pytest
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import device_ops
from multiproc.harness import run_ranks
from multiproc.test_device_path import allreduce_suite, fusion_suite, others_suite, scaling_suite

fake_cuda = _fake_cuda  # the session fixture, under its name
MIXED = "cuda-ipc+nccl"
LAYOUTS = {3: ["0000:01:00.0", "0000:01:00.0", "0000:02:00.0"],
           4: ["0000:01:00.0", "0000:02:00.0", "0000:01:00.0", "0000:02:00.0"]}


def mixed_envs(fake, np_, extra=None):
    kwargs = device_ops.rank_envs(fake, np_, False, extra)
    for r, bus in enumerate(LAYOUTS[np_]):
        kwargs["rank_env"][r]["FAKE_CUDA_BUS_IDS"] = bus
    return kwargs


@pytest.mark.parametrize("np_", [3, 4])
def test_hierarchical_allreduce_every_dtype_and_op(fake_cuda, np_):
    results = run_ranks(allreduce_suite, np_, args=(MIXED,), timeout=300,
                        **mixed_envs(fake_cuda, np_))
    assert all(r.value > 0 for r in results)


def test_scales_and_average_divide_by_the_whole_set(fake_cuda):
    results = run_ranks(scaling_suite, 4, timeout=240, **mixed_envs(fake_cuda, 4))
    assert [r.value for r in results] == [MIXED] * 4


def test_fused_batches(fake_cuda):
    results = run_ranks(fusion_suite, 3, timeout=240,
                        **mixed_envs(fake_cuda, 3, {"HVD_CYCLE_TIME_MS": "20"}))
    assert all(r.value > 0 for r in results), "nothing fused: the test proves nothing"


def test_other_collectives_stage_correctly(fake_cuda):
    results = run_ranks(others_suite, 4, timeout=240, **mixed_envs(fake_cuda, 4))
    assert [r.value for r in results] == [MIXED] * 4


def roles():
    """Who did what: leaders ran NCCL, the others none; each rank mapped its GPU's peers."""
    import numpy as np
    hvd = device_ops.init()
    f = device_ops.fakes()
    out = device_ops.allreduce(np.full(8, hvd.rank() + 1.0, np.float32), hvd.Average, "roles")
    assert out.tolist() == [(hvd.size() + 1) / 2] * 8, out
    return f.nccl.fakeNcclCollectives(), f.cuda.fakeCudaLiveIpcMappings(), device_ops.gpu_path()


def test_leaders_meet_in_nccl_and_the_others_over_ipc(fake_cuda):
    results = [r.value for r in run_ranks(roles, 4, timeout=120, **mixed_envs(fake_cuda, 4))]
    # LAYOUTS[4]: ranks 0, 2 on GPU 1 (leader 0), ranks 1, 3 on GPU 2 (leader 1)
    assert [n > 0 for n, _, _ in results] == [True, True, False, False], results
    assert [m for _, m, _ in results] == [1, 1, 1, 1], results
    assert {p for _, _, p in results} == {MIXED}, results


def test_abort_mid_hierarchical_allreduce_then_reinit(fake_cuda):
    """The last rank's producer never finishes: its GPU's leader waits for it on the device,
    the other leader in NCCL. Rank 0 aborts; every rank fails within HVD_TIMEOUT, and after
    shutdown + init the set is mixed again with its mappings made afresh (none leaked)."""
    from multiproc.test_device_ipc_faults import TIMEOUT, stuck_ipc_peer
    results = run_ranks(stuck_ipc_peer, 4, args=("abort",), timeout=120,
                        **mixed_envs(fake_cuda, 4, {"HVD_TIMEOUT": str(TIMEOUT)}))
    assert results[0].value["pending"], "the op finished although a peer was stuck"
    for r in results:
        v = r.value
        assert v["error"] and v["seconds"] < TIMEOUT + 3, v
        assert v["mapped"] == 1 and v["after_shutdown"] == 0, v
        assert v["again"] and v["path"] == MIXED, v
        # a path never run on hardware warns once per process (issue #39 item 6), not again
        # after the re-init
        assert r.stderr.count("a mixed process set (CUDA IPC within each GPU, NCCL between "
                              "GPUs) has not yet been verified on a GPU") == 1, r.stderr
        assert v["remapped"] == 1 and v["final"] == 0, v
