"""benchmarks/bench_gpu.py's ``ipc_mps`` case (issue #19) and ``nccl2`` case (issue #39) cannot
run without a GPU; this checks their control flow: every rank run happens under the MPS daemon the case started (the ranks
inherit CUDA_MPS_PIPE_DIRECTORY), the daemon is stopped afterwards (also when a run fails),
and ``--dry-run`` writes the report with both verdicts. A fake ``nvidia-cuda-mps-control``
(tests/fake_mps.py) stands in for the real one."""
import argparse
import importlib.util
import os
import subprocess
import sys

import pytest
from fake_mps import fake_mps_control, records

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BENCH = os.path.join(REPO, "benchmarks", "bench_gpu.py")


@pytest.fixture
def bench(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", fake_mps_control(tmp_path / "mps") + os.pathsep
                       + os.environ["PATH"])
    monkeypatch.setenv("FAKE_MPS_RECORD", str(tmp_path / "record"))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    spec = importlib.util.spec_from_file_location("bench_gpu_under_test", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, str(tmp_path / "record")


def test_every_run_is_under_the_daemon_which_is_stopped_after(bench):
    module, record = bench
    seen = []

    def spy(fn, size, system, *rest, env=None):
        pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
        up = bool(pipe) and os.path.exists(os.path.join(pipe, "control"))  # the daemon lives
        seen.append((fn.__name__, system, size, pipe if up else None, env))
        return module._dry_results(fn, size, system, *rest)

    args = argparse.Namespace(iters=10, steps=3, step_env=[{"HVD_CYCLE_TIME_MS": "5"}])
    _, rows, verdicts = module.case_ipc_mps(args, run=spy)
    pipes = {p for *_, p, _ in seen}
    assert len(pipes) == 1 and None not in pipes, seen
    assert [(n, s) for n, s, *_ in seen] == [
        ("rank_latency", "ours")] * 3 + [("rank_allreduce", s) for _ in range(3)
                                     for s in ("ours", "gloo")] + [
        ("rank_step", s) for s in ("alone", "ours", "ours", "ddp")]
    assert [env for *_, env in seen if env] == [{"HVD_CYCLE_TIME_MS": "5"}], "--step-env's run"
    assert ("CNN step, ours, HVD_CYCLE_TIME_MS=5", "2.00 ms") in rows
    assert all(size == 2 for _, _, size, _, _ in seen)
    assert [what for what, _ in records(record)][-2:] == ["quit", "exit"]
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert [k for k, _, _ in verdicts] == ["ipc_mps_latency", "ipc_mps_step"]
    assert verdicts[1][1] == pytest.approx(2.5)  # ddp 5 ms / ours 2 ms in the made-up results


def test_a_failing_run_still_stops_the_daemon(bench):
    module, record = bench

    def boom(*args):
        raise RuntimeError("rank 1 died")
    with pytest.raises(RuntimeError, match="rank 1 died"):
        module.case_ipc_mps(argparse.Namespace(iters=10, steps=3, step_env=[]), run=boom)
    assert [what for what, _ in records(record)][-2:] == ["quit", "exit"]
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ


def test_dry_run_writes_the_report(bench, tmp_path):
    _, record = bench
    out = tmp_path / "bench.md"
    proc = subprocess.run([sys.executable, BENCH, "--cases", "ipc_mps", "--dry-run",
                           "--step-env", "HVD_CYCLE_TIME_MS=5", "--out", str(out)],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    text = out.read_text()
    assert "2 ranks sharing one GPU under MPS" in text and "| 256 MiB busbw |" in text
    assert "| CNN step, ours, HVD_CYCLE_TIME_MS=5 |" in text
    assert "| ipc_mps_latency |" in text and "| ipc_mps_step |" in text
    assert "| met |" not in text and "| dry run |" in text, "made-up figures get no verdict"
    assert [what for what, _ in records(record)][-2:] == ["quit", "exit"]


def test_nccl2_runs_ours_and_torch_under_the_daemon_with_the_same_nccl_variables(bench,
                                                                                  monkeypatch):
    module, record = bench
    from engine_native import gpu
    monkeypatch.setattr(gpu, "nccl_info", lambda: {"loaded": True, "version": 23203,
                                                   "version_text": "2.32.3", "path": "x.so"})
    monkeypatch.delenv("NCCL_MAX_CTAS", raising=False)
    seen = []

    def spy(fn, size, system, *rest, env=None):
        pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY")
        seen.append((fn.__name__, system, size, bool(pipe), env))
        if fn is module.rank_latency:
            return [{"waited": [40e-6 if system == "ours" else 50e-6]} | {"path": "nccl"}] * 2
        return module._dry_results(fn, size, system, *rest)

    monkeypatch.setattr(module, "run", spy)
    _, _, verdicts = module.case_nccl2(argparse.Namespace(iters=10))
    shared = {"NCCL_MULTI_RANK_GPU_ENABLE": "1", "NCCL_MAX_CTAS": "8"}
    assert seen == [("rank_allreduce", s, 2, True, dict(shared, HVD_GPU_PATH="nccl")
                     if s == "ours" else shared) for _ in range(3) for s in ("ours", "nccl")] + [
        ("rank_latency", "ours", 2, True, dict(shared, HVD_GPU_PATH="nccl")),
        ("rank_latency", "torch", 2, True, shared)], seen
    assert [k for k, _, _ in verdicts] == ["nccl2_busbw", "nccl2_latency"]
    assert verdicts[1][1] == pytest.approx(0.8)
    assert [what for what, _ in records(record)][-2:] == ["quit", "exit"]


def test_nccl2_refuses_an_nccl_that_takes_one_rank_per_gpu(bench, monkeypatch):
    module, _ = bench
    from engine_native import gpu
    monkeypatch.setattr(gpu, "nccl_info", lambda: {"loaded": True, "version": 22809,
                                                   "version_text": "2.28.9", "path": "x.so"})
    with pytest.raises(RuntimeError, match="NCCL 2.28.9 takes one rank per GPU"):
        module.case_nccl2(argparse.Namespace(iters=10))
