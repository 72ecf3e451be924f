"""join(device=...) in a process without CUDA devices is a CPU join, as in Horovod built without
GPU support (its DoJoin forces the CPU device): the rank that names a device takes part in the
join, its peers' collectives get its zeros, and every rank learns the last rank to join
(Note [join's device without CUDA]). Refusing the device instead left that rank out of the join
and its peers waiting for it forever.

Checked on spawned ranks with the fake CUDA runtime seeing no device (the core's branch), with
the real runtime hidden by ``CUDA_VISIBLE_DEVICES=""`` (whatever this machine has), and, in one
process, with no CUDA runtime at all (the Python branch). With devices, the named device is
where the zeros live (tests/multiproc/test_torch_cuda_fake.py) and a missing ordinal is this
rank's ValueError (test_device_edges.py).
"""
import pytest
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import device_ops
from multiproc.harness import run_ranks

pytestmark = pytest.mark.multiproc

fake_cuda = _fake_cuda  # the session fixture, under its name

DEVICES = [0, 3, 'cuda', 'cuda:1', 'torch.device(cuda, 2)']


def _device(spec):
    import torch
    return torch.device('cuda', 2) if spec == 'torch.device(cuda, 2)' else spec


def rank_joins_naming_a_device(spec, load_runtime):
    """Rank 0 joins first, naming a device; rank 1 reduces while it is joined, then joins."""
    import torch

    import engine_native.torch as hvd
    hvd.init()
    if load_runtime:
        from engine_native import gpu
        gpu.require_cuda()  # the core's CUDA table is there, and sees no device
    me = hvd.rank()
    out = None
    if me == 0:
        last = hvd.join(_device(spec))
    else:
        out = hvd.allreduce(torch.full((5,), 3.0), op=hvd.Sum, name='while.joined').tolist()
        last = hvd.join()
    after = hvd.allreduce(torch.tensor([me + 1]), op=hvd.Sum, name='after.join').item()
    hvd.shutdown()
    return last, out, after


def _check(results):
    assert results[0].value == (1, None, 3), results[0].value
    assert results[1].value == (1, [3.0] * 5, 3), results[1].value


@pytest.mark.parametrize('spec', DEVICES)
def test_join_naming_a_device_without_cuda_devices_is_a_cpu_join(fake_cuda, spec):
    kwargs = device_ops.rank_envs(fake_cuda, 2, False, {'FAKE_CUDA_DEVICE_COUNT': '0'})
    _check(run_ranks(rank_joins_naming_a_device, 2, args=(spec, True), timeout=60, **kwargs))


@pytest.mark.parametrize('spec', [0, 'cuda'])
def test_join_naming_a_device_with_cuda_hidden_is_a_cpu_join(spec):
    _check(run_ranks(rank_joins_naming_a_device, 2, args=(spec, False), timeout=60,
                     env={'CUDA_VISIBLE_DEVICES': ''}))


def test_join_device_without_a_cuda_runtime_is_the_cpu(monkeypatch):
    from engine_native import gpu
    from engine_native.torch import devices

    def no_runtime():
        raise RuntimeError('no CUDA runtime (this test)')

    monkeypatch.setattr(gpu, 'require_cuda', no_runtime)
    monkeypatch.setattr(devices, '_cuda_ready', False)
    for spec in DEVICES:
        assert devices.join_device(_device(spec)) == -1, spec
    assert devices.join_device(-1) == -1 and devices.join_device('cpu') == -1
    with pytest.raises(ValueError, match='expected a CUDA device'):
        devices.join_device('meta')
