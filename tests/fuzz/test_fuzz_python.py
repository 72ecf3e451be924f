"""The Python decoders of peer bytes (py_targets.py): a bounded pass of py_fuzz.py over every
target, after its regression inputs (tests/fuzz/seeds), and its hang guard on a decoder that
never returns. Each pass runs in a subprocess: the hang guard's SIGALRM timer would otherwise
cancel pytest-timeout's. The long run is ``python tests/fuzz/run.py``.
"""
import os
import re
import subprocess
import sys

import py_targets  # tests/fuzz is on sys.path (rootdir-relative import)

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
INPUTS = 10_000  # per decoder: ~10 s for all of them on two cores
ROW = re.compile(r"^(\w+)\s+\|\s+(\d+)\s+\|\s+(\d+)\s+\|\s+(\d+)\s+\|\s+(\d+)\s+\|", re.M)


def run_python(args, timeout=300):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([REPO, HERE]))
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


def test_every_python_decoder_survives_a_bounded_fuzz_pass():
    proc = run_python([os.path.join(HERE, "py_fuzz.py"), "--inputs", str(INPUTS), "--seed", "35"])
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    rows = {m[0]: [int(x) for x in m[1:]] for m in ROW.findall(proc.stdout)}
    assert sorted(rows) == sorted(t.name for t in py_targets.TARGETS), proc.stdout
    for name, (inputs, accepted, rejected, crashes) in rows.items():
        assert inputs == INPUTS and accepted + rejected == inputs and crashes == 0, name
        assert accepted > 0, f"{name} refuses its own encoder's seeds"


HANG = """
import sys, time, py_fuzz, py_targets
def run(data):
    time.sleep(3600) if data.startswith(b"!") else None
    return "accepted"
target = py_targets.Target("sleeper", "time.sleep", lambda rng: [b"a", b"!"], run)
counts = py_fuzz.fuzz(target, 5, seed=1, hang_seconds=0.5)
print(counts["crashes"], counts["accepted"])
"""


def test_a_decoder_that_never_returns_is_reported_as_a_hang():
    proc = run_python(["-c", HANG], timeout=60)
    assert proc.returncode == 0, proc.stderr
    crashes, accepted = map(int, proc.stdout.split())
    assert crashes >= 1 and crashes + accepted == 5, proc.stdout
    assert "=== py_fuzz: hang ===" in proc.stderr
    assert "reproducer: target=sleeper seed=1 input#=1" in proc.stderr
