"""The dashboard's GPU columns (#16): a rank's pinned GPU, the memory its process holds, the GPU's
utilisation and the path of its CUDA collectives, from the engine's publisher (NVML through a
fake pynvml, torch only when CUDA is already initialised) to the model, the widget rows and the
text status. CPU ranks show ``cpu`` and no GPU columns."""
import os
import re
import sys
import types

import pytest
from gpu_fakes import FakeNvml
from hvd_magic.widgets import fmt
from hvd_magic.widgets import model as M
from hvd_magic.widgets import publisher as P
from hvd_magic.widgets import snapshot as S
from hvd_magic.widgets import text as T
from hvd_magic.widgets import view as V
from hvd_magic.widgets.gpu_stats import GpuStats, gpu_path

PIN = {"device": "cuda:0", "gpu_index": 3, "visible_devices": "3", "name": "NVIDIA H100",
       "memory_bytes": 80 << 30, "pinned_by": "CUDA_VISIBLE_DEVICES", "staged": False}


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_nvml_gives_utilisation_device_memory_and_this_process_memory():
    nvml = FakeNvml(used=5 << 30, util=87, procs=[(os.getpid(), 2 << 30), (1, 9 << 30)])
    out = GpuStats(PIN, nvml=nvml)()
    assert out == {"kind": "cuda", "index": 0, "gpu": 3, "name": "NVIDIA H100",
                   "mem_total": 80 << 30, "dev_mem_used": 5 << 30, "util": 87,
                   "mem_used": 2 << 30}
    assert "nvmlDeviceGetHandleByIndex" in nvml.calls
    by_uuid = FakeNvml()
    GpuStats(dict(PIN, visible_devices="GPU-0003-fake"), nvml=by_uuid)()
    assert "nvmlDeviceGetHandleByUUID" in by_uuid.calls


def test_the_gpu_is_asked_at_most_once_per_interval_and_nvml_initialised_once():
    nvml, clock = FakeNvml(util=10), Clock()
    stats = GpuStats(PIN, nvml=nvml, interval_s=1.0, clock=clock)
    for step in range(10):  # the publisher's 0.3 s ticks for 3 s
        clock.now = step * 0.3
        stats()
    assert stats.queries == 3  # t = 0, 1.2, 2.4
    assert nvml.calls.count("nvmlInit") == 1 and nvml.calls.count(
        "nvmlDeviceGetHandleByIndex") == 1
    nvml.util = 55
    clock.now = 3.6
    assert stats()["util"] == 55


def test_a_failing_nvml_is_given_up_and_never_asked_again():
    nvml, clock = FakeNvml(broken="nvmlDeviceGetUtilizationRates"), Clock()
    stats = GpuStats(PIN, nvml=nvml, interval_s=0.0, clock=clock)
    assert "util" not in stats()
    calls = len(nvml.calls)
    stats()
    stats()
    assert len(nvml.calls) == calls
    dead = FakeNvml(broken="nvmlInit")
    assert GpuStats(PIN, nvml=dead)()["gpu"] == 3 and dead.calls == ["nvmlInit"]


def test_a_cpu_rank_has_no_gpu_and_asks_nothing():
    nvml = FakeNvml()
    assert GpuStats({"device": "cpu", "reason": "no GPU visible"}, nvml=nvml)() == {}
    assert GpuStats(None, nvml=nvml)() == {}
    assert nvml.calls == []


@pytest.mark.parametrize("initialised", [False, True])
def test_without_nvml_memory_comes_from_torch_only_when_cuda_is_initialised(monkeypatch,
                                                                            initialised):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    asked = []
    cuda = types.SimpleNamespace(is_initialized=lambda: initialised,
                                 memory_reserved=lambda i: asked.append(i) or 7 << 20)
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    out = GpuStats(PIN)()
    assert out.get("mem_used") == (7 << 20 if initialised else None)
    assert asked == ([0] if initialised else [])
    assert "util" not in out


def test_a_torch_ordinal_pin_is_not_looked_up_in_nvml():
    nvml = FakeNvml()
    pin = dict(PIN, device="cuda:1", pinned_by="torch.cuda.set_device (CUDA already initialised)")
    assert GpuStats(pin, nvml=nvml)()["index"] == 1 and nvml.calls == []


@pytest.mark.parametrize("paths, want", [
    ({}, None), (None, None), ({0: {"path": "nccl", "device": 0}}, "nccl"),
    ({10: {"path": "nccl"}, 2: {"path": "staged"}}, "staged"), ({0: {"path": "odd"}}, None),
    ({0: {"path": "cuda-ipc"}}, "cuda-ipc"), ({0: {"path": "cuda-ipc+nccl"}}, "cuda-ipc+nccl")])
def test_path_of_the_cuda_collectives(paths, want):
    assert gpu_path({"gpu_paths": paths}) == want


def test_path_under_mps_is_labelled_so(monkeypatch):
    core = {"gpu_paths": {0: {"path": "cuda-ipc"}}, "mps_pipe_directory": "/tmp/hvd-mps-x/pipe"}
    assert gpu_path(core) == "cuda-ipc/mps"
    assert fmt.gpu_path(gpu_path(core)) == "CUDA IPC under MPS"
    assert gpu_path(dict(core, mps_pipe_directory="")) == "cuda-ipc"
    sent = S.validate({"v": 1, "rank": 0, "t": 1.0, "device": {"kind": "cuda",
                                                              "path": "cuda-ipc/mps"}})
    assert sent["device"]["path"] == "cuda-ipc/mps"  # the snapshot keeps it for the driver
    from engine_native import basics
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", "/tmp/hvd-mps-x/pipe")
    assert basics.metrics()["mps_pipe_directory"] == "/tmp/hvd-mps-x/pipe"


def test_publisher_sends_the_gpu_columns_and_the_driver_keeps_them():
    core = {"ops": [], "bytes": [], "gpu_paths": {0: {"path": "staged", "device": 0}}}
    pub = P.Publisher("tcp://127.0.0.1:1", rank=2, metrics=lambda: core,
                      gpu=GpuStats(PIN, nvml=FakeNvml(util=40, procs=[(os.getpid(), 1 << 30)])))
    sent = S.unpack(S.pack(pub.snapshot()))["device"]
    assert sent == {"kind": "cuda", "index": 0, "gpu": 3, "name": "NVIDIA H100",
                    "mem_total": 80 << 30, "dev_mem_used": 3 << 30, "util": 40,
                    "mem_used": 1 << 30, "path": "staged"}
    bad = S.validate({"v": 1, "rank": 0, "t": 1.0, "device": {
        "kind": "cuda", "util": 250, "path": "carrier pigeon", "gpu": -1}})["device"]
    assert bad == {"kind": "cuda"}
    cpu = P.Publisher("tcp://127.0.0.1:1", rank=0, metrics=lambda: core, device="cpu",
                      gpu=GpuStats({"device": "cpu"}))
    assert cpu.snapshot()["device"] == {"kind": "cpu"}


def _model(devices):
    m = M.DashboardModel()
    for rank, dev in enumerate(devices):
        m.ingest(rank, {"v": 1, "rank": rank, "t": 1.0, "pid": 100 + rank, "host": "node0",
                        "busy": False, "device": dev, "core": {"ops": {}, "bytes": {}}}, now=0.0)
    return m


GPU_DEV = {"kind": "cuda", "index": 0, "gpu": 3, "name": "NVIDIA H100", "mem_used": 2 << 30,
           "mem_total": 80 << 30, "dev_mem_used": 5 << 30, "util": 87, "path": "nccl"}


def test_rows_carry_the_pinned_gpu_its_memory_utilisation_and_path():
    rows = _model([GPU_DEV, dict(GPU_DEV, gpu=1, util=0, path="staged"), {"kind": "cpu"}]).rows(0)
    r = rows[0]
    assert (r.device, r.gpu_index, r.gpu_name, r.gpu_mem_used, r.gpu_util, r.gpu_path) == (
        "cuda:0", 3, "NVIDIA H100", 2 << 30, 87, "nccl")
    assert (rows[1].gpu_index, rows[1].gpu_path, rows[2].device, rows[2].gpu_path) == (
        1, "staged", "cpu", "")


def cell(row_html, cls):
    """The text of the grid cell of class ``cls`` in a row."""
    found = re.search(f'class="{cls}"[^>]*>([^<]*)<', row_html)
    return found and found.group(1)


def test_widget_rows_show_gpu_columns_only_when_a_rank_has_a_gpu():
    m = _model([GPU_DEV, dict(GPU_DEV, gpu=4, path=None), {"kind": "cpu"}])
    view = V.DashboardView()
    view.update(m, 0.0)
    header = view.rows_box.children[0].value
    assert all(f">{name}<" in header for name in ("gpu mem", "util", "path"))
    r0, r1, r2 = (w.value for w in view.rows_box.children[1:])
    assert [cell(r0, c) for c in ("hvd-device", "hvd-gpu-mem", "hvd-gpu-util", "hvd-gpu-path")
            ] == ["GPU 3 H100", "2.0 GiB", "87%", "NCCL"]
    assert "nvidia-smi index 3" in r0 and "5.0 GiB in use by all processes" in r0  # tooltip
    assert cell(r1, "hvd-gpu-path") == "—"  # no CUDA collective yet
    assert [cell(r2, c) for c in ("hvd-device", "hvd-gpu-mem", "hvd-gpu-util", "hvd-gpu-path")
            ] == ["cpu", "", "", ""]  # a CPU rank: empty GPU cells
    cpu_only = V.DashboardView()
    cpu_only.update(_model([{"kind": "cpu"}, {"kind": "cpu"}]), 0.0)
    assert "gpu mem" not in cpu_only.rows_box.children[0].value
    assert all("hvd-gpu" not in w.value for w in cpu_only.rows_box.children[1:])


def test_text_status_shows_the_gpu_compactly_and_cpu_as_cpu():
    rows = _model([GPU_DEV, {"kind": "cpu"}]).rows(0)
    assert T.row_text(rows[0]).startswith("r0 node0 pid 100 GPU 3 H100 2.0 GiB 87% NCCL idle")
    assert T.row_text(rows[1]).startswith("r1 node0 pid 101 cpu idle")
    no_index = _model([{"kind": "cuda", "index": 1}]).rows(0)[0]
    assert T.row_text(no_index).startswith("r0 node0 pid 100 cuda:1 – —")


@pytest.mark.parametrize("path, label", [("cuda-ipc", "CUDA IPC"),
                                         ("cuda-ipc+nccl", "CUDA IPC + NCCL"),
                                         ("local", "local (one rank)"),
                                         ("staged", "staged")])
def test_widget_rows_name_every_device_path(path, label):
    """Ranks sharing a GPU (CUDA IPC, alone or under NCCL between GPUs) are named, not '—'."""
    view = V.DashboardView()
    view.update(_model([dict(GPU_DEV, path=path)]), 0.0)
    assert cell(view.rows_box.children[1].value, "hvd-gpu-path") == label
