"""Fixtures of the launcher tests: a marker in the environment of everything a test starts, and
a check after the test that no marked process outlived it (killing any that did)."""
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

MARK = "HVD_LAUNCH_TEST_MARK"
HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "scripts")


def marked_processes(mark: str) -> dict:
    """pid -> command line of live processes started with ``MARK=mark`` (zombies excluded)."""
    needle = f"{MARK}={mark}".encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                if fh.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
            with open(f"/proc/{entry}/environ", "rb") as fh:
                if needle not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                found[int(entry)] = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            pass
    return found


@pytest.fixture
def no_leaks(monkeypatch):
    """Mark this test's children; fail the test if any is still alive 5 s after it ends."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK, mark)
    yield mark
    deadline = time.monotonic() + 5.0
    left = marked_processes(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = marked_processes(mark)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    assert not left, f"processes outlived the test: {left}"


def hvdrun(*args, timeout: float = 120, env=None, **kwargs) -> subprocess.CompletedProcess:
    """Run ``hvdrun ARGS`` (as ``python -m hvd_magic.launch.hvdrun``) under a hard timeout."""
    cmd = [sys.executable, "-m", "hvd_magic.launch.hvdrun", *args]
    full_env = dict(os.environ, **(env or {}))
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env,
                          **kwargs)


def script(name: str) -> str:
    return os.path.join(SCRIPTS, name)


@pytest.fixture(scope="session")
def spark():
    """One local[2] Spark session (and JVM) for test_spark.py and test_spark_estimator.py:
    tests/conftest.py runs both files in one worker, so the JVM starts once."""
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[2]").appName("hvd-magic-launch-tests")
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false")
               .config("spark.driver.host", "127.0.0.1")
               .getOrCreate())
    session.sparkContext.setLogLevel("FATAL")
    yield session
    session.stop()
    _stop_spark_jvm()


def _stop_spark_jvm():
    """session.stop() leaves pyspark's gateway JVM running until this interpreter exits; end
    it here so no process outlives the tests that started it."""
    from pyspark import SparkContext

    gateway, SparkContext._gateway, SparkContext._jvm = SparkContext._gateway, None, None
    if gateway is None:
        return
    gateway.shutdown()
    proc = getattr(gateway, "proc", None)
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
