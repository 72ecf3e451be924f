"""``%hvd_start`` pins one GPU per local rank through engine_native.gpu.pin_gpu (#16), says once
when ranks share GPUs, shows the pinned GPU in the dashboard's rows, and never touches
torch.cuda on the engines: a CPU-only cluster pays no CUDA context. The kernel starts its
cluster with the same ``%hvd_start``.

No GPU here: a fake nvidia-smi on PATH lists the GPUs; a sitecustomize on the engines'
PYTHONPATH records every torch.cuda call that finds, pins or initialises a GPU
(tests/gpu_fakes.py)."""

import os

import pytest
from cluster_harness import dashboard_rows, kill_rank, magics, start_cluster, stop_cluster, wait_for
from gpu_fakes import cuda_tracer, fake_smi

pytestmark = [pytest.mark.timeout(300)]

# Every rank's view, gathered on rank 0 (the cell's value): rank, local rank,
# CUDA_VISIBLE_DEVICES, torch.cuda initialised?, the traced torch.cuda calls, the local rank
# torch.cuda.set_device maps (gpu_compat), and a CPU allreduce's result.
PROBE = """%%hvd
import os
total = hvd.allreduce(torch.ones(2) * (hvd.rank() + 1), op=hvd.Sum, name="probe")
hvd.allgather_object([hvd.rank(), hvd.local_rank(), os.environ.get("CUDA_VISIBLE_DEVICES"),
                      torch.cuda.is_initialized(), list(torch.cuda._hvd_touched),
                      getattr(torch.cuda.set_device, "_hvd_pinned_local_rank", None),
                      total.tolist()])
"""


@pytest.fixture
def engines_env(monkeypatch, tmp_path):
    """Returns use(gpus): the engines then see ``gpus`` fake GPUs and are traced."""
    def use(gpus):
        monkeypatch.setenv("PATH", fake_smi(tmp_path / "smi", gpus) + os.pathsep
                           + os.environ["PATH"])
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
            p for p in (cuda_tracer(tmp_path / "tracer"), os.environ.get("PYTHONPATH")) if p))
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    return use


def test_hvd_start_pins_a_gpu_per_local_rank_without_touching_cuda(no_cluster, shell, run,
                                                                    engines_env):
    engines_env(2)
    try:
        started = start_cluster(shell, "-n 3 --launcher local --timeout 120")
        assert started.text.count("3 ranks on ") == 1, started.text  # sharing, said once
        assert "share 2 GPU(s)" in started.text
        res = run(PROBE)
        assert res.error is None, res.text
        assert res.value == [[0, 0, "0", False, [], 0, [6.0, 6.0]],
                             [1, 1, "1", False, [], 1, [6.0, 6.0]],
                             [2, 2, "0", False, [], 2, [6.0, 6.0]]]
        assert [(r.rank, r.device, r.device_name) for r in magics().cluster.ranks] == [
            (r, "cuda:0", f"GPU {r % 2}: NVIDIA Fake A100") for r in range(3)]
        assert "rank 1 -> cuda:0 (GPU 1: NVIDIA Fake A100)" in started.text
        wait_for(lambda: [r.gpu_index for r in dashboard_rows()] == [0, 1, 0], what="GPU rows")
        assert {(r.device, r.gpu_name, r.gpu_mem_total, r.gpu_path) for r in dashboard_rows()} == {
            ("cuda:0", "NVIDIA Fake A100", 40960 << 20, "")}
    finally:
        stop_cluster(shell)


def test_a_cluster_without_gpus_pays_nothing(no_cluster, shell, run, engines_env):
    engines_env(0)
    try:
        started = start_cluster(shell, "-n 2 --launcher local --timeout 120")
        assert "share" not in started.text
        res = run(PROBE)
        assert res.error is None, res.text
        assert res.value == [[0, 0, None, False, [], None, [3.0, 3.0]],
                             [1, 1, None, False, [], None, [3.0, 3.0]]]
        wait_for(lambda: [r.device for r in dashboard_rows()] == ["cpu", "cpu"], what="CPU rows")
    finally:
        stop_cluster(shell)


def test_hvd_scale_pins_new_ranks_and_a_replacement_takes_the_dead_ranks_gpu(
        no_cluster, shell, run, engines_env):
    engines_env(3)
    try:
        start_cluster(shell, "-n 2 --launcher local --timeout 120 --no-dashboard")
        res = run("%hvd_scale -n 3")
        assert res.error is None, res.text
        res = run(PROBE)
        assert res.error is None, res.text
        assert [v[:3] for v in res.value] == [[0, 0, "0"], [1, 1, "1"], [2, 2, "2"]]
        kill_rank(1)
        res = run("%hvd_scale -n 3")  # a replacement: GPU 1 is free again
        assert res.error is None, res.text
        res = run(PROBE)
        assert res.error is None, res.text
        assert [v[:3] for v in res.value] == [[0, 0, "0"], [1, 1, "2"], [2, 2, "1"]]
        assert [v[3:5] for v in res.value] == [[False, []]] * 3  # CUDA never touched
    finally:
        stop_cluster(shell)
