"""engine_native.gpu_devices: which GPU a rank uses (pin_gpu, through engine_native.gpu), without
a GPU: devices given as a count or a list, CUDA_VISIBLE_DEVICES, or a fake nvidia-smi on PATH."""
import stat
import sys
import warnings

import pytest

from engine_native import gpu, gpu_devices


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(gpu_devices, "_sharing_warned", False)


@pytest.mark.parametrize("devices, visible, why", [
    (0, None, "given lists no GPU"), (2, "", "hides every GPU"), (2, "-1", "hides every GPU"),
    (2, "7", "hides every GPU")])
def test_no_gpu_is_a_cpu_no_op(devices, visible, why):
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    before = dict(env)
    out = gpu.pin_gpu(0, 2, devices=devices, environ=env)
    assert out["device"] == "cpu" and why in out["reason"] and env == before


def test_one_gpu_per_local_rank(fresh_warning):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for rank in range(4):
            env = {}
            out = gpu.pin_gpu(rank, 4, devices=4, environ=env)
            assert env == {"CUDA_VISIBLE_DEVICES": str(rank), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
            assert (out["device"], out["gpu_index"], out["gpus"]) == ("cuda:0", rank, 4)
            assert not out["shared"] and not out["staged"]


def test_visible_subset_and_uuids_are_respected():
    env = {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert gpu.pin_gpu(1, 4, devices=8, environ=env)["gpu_index"] == 5
    assert env == {"CUDA_VISIBLE_DEVICES": "5"}  # the user's ordering choice is kept
    devs = [gpu.GpuDevice("0", 0, "A10", 24564 << 20, "GPU-aaaa-1"),
            gpu.GpuDevice("1", 1, "H100", 81559 << 20, "GPU-bbbb-2")]
    env = {"CUDA_VISIBLE_DEVICES": "GPU-bbbb,GPU-aaaa"}
    out = gpu.pin_gpu(0, 2, devices=devs, environ=env)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-bbbb"
    assert (out["name"], out["memory_bytes"], out["gpu_index"]) == ("H100", 81559 << 20, 1)


def test_invalid_entry_ends_the_visible_list_like_cuda():
    env = {"CUDA_VISIBLE_DEVICES": "1,x,0"}
    out = gpu.pin_gpu(0, 1, devices=2, environ=env)
    assert (out["gpu_index"], out["gpus"]) == (1, 1)
    assert env == {"CUDA_VISIBLE_DEVICES": "1,x,0"} and out["pinned_by"].startswith("unchanged")


def test_ranks_outnumbering_gpus_share_round_robin_and_warn_once(fresh_warning):
    with pytest.warns(RuntimeWarning, match=r"5 ranks on this host share 2 GPU\(s\) \(GPU 0 <- "
                      r"local ranks 0, 2, 4; GPU 1 <- local ranks 1, 3\).*reduce through CUDA IPC"):
        outs = [gpu.pin_gpu(r, 5, devices=2, environ={}) for r in range(5)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gpu.pin_gpu(0, 5, devices=2, environ={})
    assert [o["gpu_index"] for o in outs] == [0, 1, 0, 1, 0]
    assert all(o["staged"] and o["shared"] for o in outs)
    one = gpu.pin_gpu(1, 2, devices=1, environ={})
    assert (one["device"], one["shared"], one["staged"]) == ("cuda:0", True, True)


def test_bad_local_rank():
    with pytest.raises(ValueError, match="local_rank 4 is outside 0..3"):
        gpu.pin_gpu(4, 4, devices=4, environ={})


def fake_smi(tmp_path, body):
    exe = tmp_path / "nvidia-smi"
    exe.write_text("#!/bin/sh\n" + body + "\n")
    exe.chmod(exe.stat().st_mode | stat.S_IEXEC)
    return {"PATH": str(tmp_path)}


def test_nvidia_smi_discovery(tmp_path):
    env = fake_smi(tmp_path, "echo '0, GPU-aaaa-1, NVIDIA A10, 24564'\n"
                             "echo '1, GPU-bbbb-2, NVIDIA H100 80GB HBM3, 81559'")
    out = gpu.pin_gpu(1, 2, environ=env)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert (out["name"], out["memory_bytes"]) == ("NVIDIA H100 80GB HBM3", 81559 << 20)
    env = fake_smi(tmp_path, "echo 'No devices were found'; exit 6")
    assert "nvidia-smi lists no GPU" in gpu.pin_gpu(0, 1, environ=env)["reason"]


def test_no_nvidia_smi_and_no_cuda_torch_is_cpu(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    out = gpu.pin_gpu(0, 1, environ={"PATH": str(tmp_path)})
    assert out == {"device": "cpu", "reason": "no GPU visible: no nvidia-smi on PATH and no "
                   "imported CUDA-enabled torch"}
