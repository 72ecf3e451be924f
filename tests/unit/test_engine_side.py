"""``%hvd_start``'s engines without GPUs: no pinning with ``--gpus none`` (which also hides the
GPUs from the engines) or without CUDA. Torch is a stand-in recording what was asked of it.
Pinning itself (one GPU per local rank through engine_native.gpu.pin_gpu, before torch touches
CUDA) is tested in test_gpu_pinning.py and, on real engines,
tests/cluster/test_cluster_gpu_pinning.py."""
import types

import pytest

from hvd_magic import engine_side, ranksetup


class FakeCuda:
    """torch.cuda with ``count`` GPUs: records set_device; ``broken`` makes it raise."""

    def __init__(self, count, broken=None):
        self.count, self.broken, self.current = count, broken, None

    def is_available(self):
        return self.count > 0

    def device_count(self):
        return self.count

    def set_device(self, index):
        if self.broken:
            raise self.broken
        assert 0 <= index < self.count, index
        self.current = index

    def get_device_name(self, index):
        return f"Fake GPU {index}"

    def get_device_properties(self, device):
        index = int(str(device).split(":")[-1])
        return types.SimpleNamespace(total_memory=(index + 1) << 30)


@pytest.fixture
def engine(isolated):
    """init_engine's surroundings: an engine namespace, and torch = the stand-in given. The pin
    init_engine writes into this process's environment is undone afterwards (``isolated``):
    left there, the engines a later test starts (tests/cluster, in a serial run) inherit "no
    GPUs"."""
    monkeypatch = isolated
    shell = types.SimpleNamespace(user_ns={})
    monkeypatch.setattr(engine_side, "_shell", lambda: shell)
    monkeypatch.setattr(engine_side, "RANK", None)

    def start(cuda, gpus, local_rank):
        torch = types.SimpleNamespace(cuda=cuda)
        monkeypatch.setattr(engine_side, "_import", lambda name: torch if name == "torch" else None)
        return engine_side.init_engine(0, {}, gpus, local_rank, with_core=False)
    return start


@pytest.mark.parametrize("gpus, count", [("none", 2), ("auto", 0)], ids=["gpus-none", "no-cuda"])
def test_cpu_when_gpus_none_or_no_cuda(engine, gpus, count):
    cuda = FakeCuda(count)
    out = engine(cuda, gpus, 1)
    assert (out["device"], out["device_name"], cuda.current) == ("cpu", "", None)
    assert "device_memory" not in out


def test_gpus_none_hides_the_gpus_from_the_engines():
    cluster = types.SimpleNamespace(n=2, gpus="none", env={})
    assert ranksetup.engine_env(cluster)["CUDA_VISIBLE_DEVICES"] == ""
    cluster.gpus = "auto"
    assert "CUDA_VISIBLE_DEVICES" not in ranksetup.engine_env(cluster)


def test_the_start_says_which_cpus_the_core_bound_ranks_to():
    """%hvd_start's note on HVD_CPU_BIND (by default only ranks that outnumber the CPUs by a
    whole multiple are bound: hvd_magic.ranksetup.binding_note), grouped by CPU."""
    assert ranksetup.binding_note({}) is None
    note = ranksetup.binding_note({2: "1", 0: "0", 3: "1", 1: "0"})
    assert note.startswith("ranks bound to CPUs by the core (CPUs 0: ranks 0,1; CPUs 1: ranks "
                           "2,3; HVD_CPU_BIND)"), note
    assert "--env HVD_CPU_BIND=none" in note
