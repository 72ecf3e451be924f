"""hvd_magic.gpu_pinning: every launcher's pinning through engine_native.gpu.pin_gpu, and the
engines' (``%hvd_start``, the kernel) through hvd_magic.engine_side.init_engine.

No GPU here: a fake nvidia-smi on PATH lists the GPUs, and torch.cuda is traced to prove that
pinning never touches it (so a CPU-only rank pays no CUDA context)."""
import json
import os
import sys
import types
import warnings

import pytest
from gpu_fakes import fake_smi, trace_cuda

from engine_native import gpu, gpu_devices
from hvd_magic import engine_side, gpu_compat, gpu_pinning


def test_pin_narrows_to_one_gpu_and_records_it_for_children(tmp_path):
    env = {"PATH": fake_smi(tmp_path, 4)}
    out = gpu_pinning.pin(1, 4, environ=env)
    assert env["CUDA_VISIBLE_DEVICES"] == "1"
    assert (out["device"], out["gpu_index"], out["name"]) == ("cuda:0", 1, "NVIDIA Fake A100")
    assert (out["narrowed"], out["local_rank"], out["shared"]) == (True, 1, False)
    assert json.loads(env[gpu_compat.PIN_ENV]) == out
    # a process started from a pinned one keeps its parent's pin (one visible GPU now)
    assert gpu_pinning.pin(3, 4, environ=env) == out
    assert env["CUDA_VISIBLE_DEVICES"] == "1"


def test_gpus_none_hides_every_gpu_and_discovers_nothing(tmp_path):
    marker = tmp_path / "smi-ran"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\ntouch {marker}\n")
    smi.chmod(0o755)
    env = {"PATH": str(tmp_path), "CUDA_VISIBLE_DEVICES": "0,1"}
    out = gpu_pinning.pin(0, 2, "none", environ=env)
    assert (out["device"], env["CUDA_VISIBLE_DEVICES"]) == ("cpu", "")
    assert "--gpus none" in out["reason"] and not marker.exists()
    with pytest.raises(ValueError, match="gpus must be one of auto, none, got 'all'"):
        gpu_pinning.pin(0, 2, "all", environ={})


def test_no_gpu_changes_nothing(tmp_path, monkeypatch):
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # no torch to ask either
    env = {"PATH": str(tmp_path)}
    out = gpu_pinning.pin(0, 2, environ=env)
    assert (out["device"], out["narrowed"]) == ("cpu", False)
    assert "no nvidia-smi on PATH" in out["reason"]
    assert "CUDA_VISIBLE_DEVICES" not in env
    smi_env = {"PATH": fake_smi(tmp_path / "none", 0)}
    assert "nvidia-smi lists no GPU" in gpu_pinning.pin(0, 1, environ=smi_env)["reason"]


def test_a_failing_discovery_leaves_the_rank_on_cpu_with_the_reason(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("driver/library version mismatch")
    monkeypatch.setattr(gpu, "pin_gpu", broken)
    out = gpu_pinning.pin(0, 1, environ={})
    assert out["device"] == "cpu"
    assert out["reason"] == "GPU pinning failed: RuntimeError: driver/library version mismatch"


def test_sharing_is_said_once_through_the_callback_and_never_as_a_warning(isolated):
    said = []
    with warnings.catch_warnings(record=True) as escaped:
        warnings.simplefilter("always")
        outs = [gpu_pinning.pin(r, 5, environ={}, devices=2, sharing=said.append)
                for r in range(5)]
    assert [w for w in escaped if issubclass(w.category, RuntimeWarning)] == []
    assert len(said) == 1 and "5 ranks on this host share 2 GPU(s)" in said[0], said
    assert [o["gpu_index"] for o in outs] == [0, 1, 0, 1, 0]
    assert all(o["staged"] and o["shared"] for o in outs)
    note = gpu_pinning.sharing_note([("node1", o) for o in outs] + [("node2", {"device": "cpu"})])
    assert note.startswith("5 ranks on node1 share 2 GPU(s). NCCL needs one GPU per rank"), note
    assert gpu_pinning.sharing_note([("node1", {"device": "cuda:0", "staged": False})]) is None


@pytest.mark.parametrize("env, want", [
    ({"HVD_LOCAL_RANK": "2", "HVD_LOCAL_SIZE": "4"}, (2, 4)),
    ({"HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2"}, (1, 2)),
    ({"OMPI_COMM_WORLD_LOCAL_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, (3, 8)),
    ({"MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"}, (0, 2)),
    ({"HVD_LOCAL_RANK": "5", "HVD_LOCAL_SIZE": "4"}, None),
    ({"HVD_LOCAL_RANK": "1"}, None),
])
def test_local_position_from_each_launcher(env, want):
    assert gpu_pinning.local_position(env) == want


def test_a_rank_pins_itself_and_local_rank_0_says_sharing_once(isolated, tmp_path, capsys):
    isolated.setenv("PATH", fake_smi(tmp_path, 2))
    isolated.setenv("HVD_LOCAL_RANK", "1")
    isolated.setenv("HVD_LOCAL_SIZE", "3")
    out = gpu_pinning.pin_this_rank()
    assert (out["gpu_index"], os.environ["CUDA_VISIBLE_DEVICES"]) == (1, "1")
    assert capsys.readouterr().err == ""  # local rank 1 does not say it
    assert gpu_pinning.pinned() == out
    for name in ("CUDA_VISIBLE_DEVICES", gpu_compat.PIN_ENV):
        isolated.delenv(name)
    isolated.setattr(gpu_pinning, "_pinned", None)
    isolated.setattr(gpu_devices, "_sharing_warned", False)  # another rank is another process
    isolated.setenv("HVD_LOCAL_RANK", "0")
    assert gpu_pinning.pin_this_rank()["gpu_index"] == 0
    err = capsys.readouterr().err
    assert err.count("hvd_magic: 3 ranks on this host share 2 GPU(s)") == 1, err


def test_a_rank_whose_place_is_unknown_is_not_pinned(isolated, tmp_path):
    isolated.setenv("PATH", fake_smi(tmp_path, 2))
    assert gpu_pinning.pin_this_rank() is None
    assert "CUDA_VISIBLE_DEVICES" not in os.environ


def test_child_env_puts_the_set_device_mapping_first_on_pythonpath():
    env = {"PYTHONPATH": f"/a{os.pathsep}{gpu_pinning.SITE_DIR}"}
    assert gpu_pinning.child_env(dict(env)) == env  # not pinned: unchanged
    env[gpu_compat.PIN_ENV] = json.dumps({"narrowed": True, "local_rank": 1})
    assert gpu_pinning.child_env(env)["PYTHONPATH"] == os.pathsep.join([gpu_pinning.SITE_DIR,
                                                                         "/a"])
    assert os.path.isfile(os.path.join(gpu_pinning.SITE_DIR, "sitecustomize.py"))


# ---- the engines: %hvd_start and the kernel ------------------------------------------------

@pytest.fixture
def engine(isolated, tmp_path):
    """init_engine in this process: an engine namespace, a fake nvidia-smi with ``gpus`` GPUs,
    torch.cuda traced. Returns start(gpus_flag, local_rank, local_size) -> (out, touched)."""
    import torch
    touched = trace_cuda(torch.cuda, isolated)
    shell = types.SimpleNamespace(user_ns={})
    isolated.setattr(engine_side, "_shell", lambda: shell)
    isolated.setattr(engine_side, "RANK", None)

    def start(count, gpus, local_rank, local_size):
        isolated.setenv("PATH", fake_smi(tmp_path / f"smi{count}", count))
        out = engine_side.init_engine(0, {}, gpus, local_rank, with_core=False,
                                      local_size=local_size)
        assert shell.user_ns["torch"] is torch
        return out, touched
    return start


def test_engines_pin_one_gpu_per_local_rank_without_touching_cuda(engine):
    out, touched = engine(2, "auto", 1, 3)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "1"
    assert (out["device"], out["device_name"], out["device_memory"]) == (
        "cuda:0", "GPU 1: NVIDIA Fake A100", 40960 << 20)
    assert (out["gpu"]["gpu_index"], out["gpu"]["staged"]) == (1, True)
    assert touched == []  # pinned through nvidia-smi: no torch.cuda call, no CUDA context


@pytest.mark.parametrize("count, gpus", [(2, "none"), (0, "auto")], ids=["gpus-none", "no-gpu"])
def test_cpu_engines_pay_nothing(engine, count, gpus):
    out, touched = engine(count, gpus, 1, 2)
    assert (out["device"], out["device_name"]) == ("cpu", "")
    assert "device_memory" not in out
    assert os.environ.get("CUDA_VISIBLE_DEVICES", "unset") == ("" if gpus == "none" else "unset")
    assert touched == []


def test_an_engine_whose_pinning_fails_reports_it_and_stays_on_cpu(engine, isolated):
    def broken(*args, **kwargs):
        raise RuntimeError("CUDA driver too old")
    isolated.setattr(gpu, "pin_gpu", broken)
    out, touched = engine(1, "auto", 0, 1)
    assert out["device"] == "cpu" and touched == []
    assert out["device_name"] == "GPU pinning failed: RuntimeError: CUDA driver too old"
