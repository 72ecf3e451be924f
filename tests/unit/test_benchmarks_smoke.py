"""Smoke test for benchmarks/: the one command runs end to end on our core (np=2, tiny sizes).

Asserts behaviour, never timings: every case produces its table, every check iteration got the
right numbers, no launch failed, and no benchmark process is left behind.
"""

import os
import subprocess
import sys
import uuid

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _marked_processes(marker: bytes) -> list:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if marker in f.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


@pytest.mark.slow
def test_run_all_smoke_ours_np2(tmp_path):
    marker = f"HVD_BENCH_SMOKE={uuid.uuid4().hex}"
    env = dict(os.environ)
    env[marker.split("=")[0]] = marker.split("=")[1]
    report = tmp_path / "report.md"
    proc = subprocess.run(
        [sys.executable, os.path.join(REPO, "benchmarks", "run_all.py"), "--smoke", "--np", "2",
         "--systems", "ours", "--cases",
         "memcpy,allreduce,tcp,fusion,collectives,grouped,embedding,p2p,idle,floor",
         "--timeout", "60", "--out", str(report)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = report.read_text()
    for title in ("memory ceilings", "allreduce float32 sum, np=2, shm",
                  "allreduce float32 sum, np=2, forced TCP", "200 x 4 KiB",
                  "allgather, broadcast, alltoall, reducescatter",
                  "grouped allgather, float32, np=2", "embedding step",
                  "send/recv ping-pong, ranks 0 and 1 of 2",
                  "start-up and idle, np=2", "targets from the issue",
                  "issue #20's targets", "broadcast_ (in place", "issue #38's targets"):
        assert title in text, f"missing table {title!r}:\n{text}"
    assert "| alltoall | 2 | 256 KiB |" in text  # the floor case's own launch (collectives: 64 KiB)
    assert "WRONG RESULT" not in text
    assert " failed: " not in text, text
    assert "| ours | " in text and "| ours tcp | " in text  # idle rows for both transports
    assert _marked_processes(marker.encode()) == []
