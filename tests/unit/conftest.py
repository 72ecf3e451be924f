"""Fixtures of the unit tests that run the torch layer on the single-rank fake core
(tests/unit/fakecore.py): ``fake`` yields ``(engine_native.torch, core)`` with nothing
initialised; ``hvd`` yields the module initialised, with ``hvd.core`` the fake core whose
``state['log']`` records what the torch layer submitted; and ``isolated``, for tests that pin
this process's GPU (hvd_magic.gpu_pinning), which undoes the pin."""
import sys

import pytest

from engine_native import gpu_devices
from hvd_magic import gpu_compat, gpu_pinning

_LAUNCHER_VARS = ('HVD_RANK', 'HVD_SIZE', 'HOROVOD_RANK', 'HOROVOD_SIZE', 'OMPI_COMM_WORLD_RANK',
                  'PMI_RANK', 'PMIX_RANK', 'HOROVOD_ELASTIC')


@pytest.fixture
def fake(monkeypatch):
    from fakecore import fake_engine_native  # imports torch: only for the tests that use it

    for var in _LAUNCHER_VARS:
        monkeypatch.delenv(var, raising=False)
    with fake_engine_native() as (hvd, core):
        yield hvd, core


@pytest.fixture
def hvd(fake):
    hvd, core = fake
    hvd.init()
    hvd.core = core
    yield hvd
    hvd.shutdown()


PIN_VARS = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", gpu_compat.PIN_ENV, "HVD_LOCAL_RANK",
            "HVD_LOCAL_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
            "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALRANKID",
            "MPI_LOCALNRANKS")


@pytest.fixture
def isolated(monkeypatch):
    """Pinning this process (os.environ) is undone afterwards: the variables it sets, the
    set_device mapping it installs, pin_gpu's once-only sharing warning."""
    for name in PIN_VARS:
        monkeypatch.setenv(name, "x")
        monkeypatch.delenv(name)
    monkeypatch.setattr(sys, "meta_path", list(sys.meta_path))
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None:
        monkeypatch.setattr(cuda, "set_device", cuda.set_device)
    monkeypatch.setattr(gpu_devices, "_sharing_warned", False)
    monkeypatch.setattr(gpu_pinning, "_pinned", None)
    return monkeypatch
