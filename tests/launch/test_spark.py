"""HorovodRunner(np > 0) and hvd_magic.spark.run on a local[2] Spark session, barrier mode.

Skipped without pyspark or Java (tests/conftest.py); .ci/install-spark.sh installs both.
"""
import os
import time

import numpy as np
import pytest

from hvd_magic.launch import RankFailedError
from hvd_magic.runner import HorovodRunner

from . import digits

pytestmark = [pytest.mark.spark, pytest.mark.multiproc, pytest.mark.timeout(600)]


def _spark_ranks() -> list:
    """Live rank processes started by Spark tasks (their store key starts with "spark-")."""
    found = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                if b"hvd_magic.launch.task" not in fh.read():
                    continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if b"HVD_RUN_KEY=spark-" in fh.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


@pytest.fixture
def no_leaks():
    """Spark's processes do not inherit the test's environment: look for our ranks instead."""
    yield
    deadline = time.monotonic() + 10
    while _spark_ranks() and time.monotonic() < deadline:
        time.sleep(0.1)
    left = _spark_ranks()
    for pid in left:
        os.kill(pid, 9)
    assert not left, f"rank processes outlived the test: {left}"


def test_horovod_runner_trains_digits_in_barrier_mode(spark, capsys, no_leaks):
    result = HorovodRunner(np=2).run(digits.train, steps=10, batch=16, verbose=True)
    assert result["rank"] == 0 and result["size"] == 2
    ref = digits.reference(steps=10, batch=16, size=2)
    for got, want in zip(result["params"], ref["params"]):
        np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    out = capsys.readouterr().out
    assert "[0]<stdout>:step 0 loss" in out, out  # rank output streamed to the caller


def test_spark_run_returns_results_in_rank_order(spark, no_leaks):
    from hvd_magic import spark as hvd_spark

    scale = 7  # a closure over the caller's state

    def fn(offset):
        import engine_native as hvd
        hvd.init()
        total = hvd.allreduce(np.array([hvd.rank() * scale + offset]), op=hvd.Sum, name="t")
        return hvd.rank(), hvd.local_rank(), float(total[0])

    assert hvd_spark.run(fn, args=(1.0,), num_proc=2) == [(0, 0, 9.0), (1, 1, 9.0)]


def test_task_failure_is_an_error_in_the_caller(spark, no_leaks):
    def main():
        import engine_native as hvd
        hvd.init()
        hvd.allreduce(np.ones(1), name="warm-up")
        if hvd.rank() == 1:
            raise ArithmeticError("deliberate failure in a Spark task")
        hvd.allreduce(np.ones(1), name="never")
        time.sleep(300)

    start = time.monotonic()
    with pytest.raises(RankFailedError) as info:
        HorovodRunner(np=2).run(main)
    assert time.monotonic() - start < 120
    assert info.value.rank == 1 and isinstance(info.value.exception, ArithmeticError)
    assert "deliberate failure in a Spark task" in info.value.remote_traceback
    # the session is still usable
    assert spark.sparkContext.parallelize(range(4), 2).sum() == 6


def test_more_ranks_than_slots_fails_at_once(spark):
    with pytest.raises(ValueError, match="3 ranks need 3 task slots"):
        HorovodRunner(np=3).run(lambda: 1)
