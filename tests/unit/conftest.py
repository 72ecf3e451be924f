"""Fixtures of the unit tests that run the torch layer on the single-rank fake core
(tests/unit/fakecore.py): ``fake`` yields ``(engine_native.torch, core)`` with nothing
initialised; ``hvd`` yields the module initialised, with ``hvd.core`` the fake core whose
``state['log']`` records what the torch layer submitted."""
import pytest

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
