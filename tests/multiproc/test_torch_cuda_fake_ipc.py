"""engine_native.torch on fake CUDA tensors (tests/multiproc/torch_cuda_fake.py) when the ranks
share one GPU and the core takes CUDA IPC: the allreduce family (every op, scales, grouped,
in place), allgather/broadcast/alltoall/reducescatter, and join(device=...) while a peer still
reduces — each checked on values computed locally from every rank's input, each asserting the
op ran on the device path (ready event recorded and waited for, data copied on the stream).
"""
import pytest
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import device_ops
from multiproc.harness import run_ranks
from multiproc.test_torch_cuda_fake import allreduce_family, gather_family, join_on_device

fake_cuda = _fake_cuda  # the session fixture, under its name
IPC = "cuda-ipc"


@pytest.mark.parametrize("fn", [allreduce_family, gather_family, join_on_device],
                         ids=["allreduce-family", "gather-family", "join"])
@pytest.mark.parametrize("np_", [2, 3])
def test_torch_collectives_over_cuda_ipc(fake_cuda, fn, np_):
    results = run_ranks(fn, np_, timeout=180,
                        **device_ops.rank_envs(fake_cuda, np_, True, ipc=True))
    assert [res.value for res in results] == [IPC] * np_
