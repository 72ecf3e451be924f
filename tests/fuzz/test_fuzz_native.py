"""The C++ decoders of peer bytes under AddressSanitizer + UndefinedBehaviorSanitizer: a bounded
fuzz pass of every target of fuzz_decoders (tests/fuzz/driver), after its regression inputs
(tests/fuzz/seeds), and the planted canaries that show a report, a reproducer and a hang are
really caught. The build is made here (build_fuzzer.py, reused while the sources are
unchanged); a failed build fails these tests. The long run is ``python tests/fuzz/run.py``.
"""
import re
import subprocess

import build_fuzzer  # tests/fuzz is on sys.path (rootdir-relative import)
import pytest

INPUTS = 20_000  # per decoder: ~10 s for all of them on two cores, after the build
ROW = re.compile(r"^(\w+)\s+\|\s+(\d+)\s+\|\s+(\d+)\s+\|\s+(\d+)\s+\|\s+(\d+)\s+\|", re.M)
# Decoders whose every input is refused by design: none can prove the job secret.
NEVER_ACCEPTS = {"handshake_dialer"}


@pytest.fixture(scope="module")
def driver():
    return build_fuzzer.build()


def run(driver, *args, timeout=300):
    return subprocess.run([driver, *args], capture_output=True, text=True, timeout=timeout,
                          check=False)


def test_every_decoder_survives_a_bounded_fuzz_pass(driver):
    names = [line.split()[0] for line in run(driver, "--list").stdout.splitlines()]
    assert len(names) >= 10, names
    proc = run(driver, "--inputs", str(INPUTS), "--seed", "35", "--seeds", build_fuzzer.SEEDS)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-6000:]
    rows = {m[0]: [int(x) for x in m[1:]] for m in ROW.findall(proc.stdout)}
    assert sorted(rows) == sorted(names), proc.stdout
    for name, (inputs, accepted, rejected, crashes) in rows.items():
        assert inputs == INPUTS and accepted + rejected == inputs and crashes == 0, name
        # A decoder that refuses its own encoder's seeds has drifted from it.
        assert (accepted == 0) == (name in NEVER_ACCEPTS), (name, accepted)


@pytest.mark.parametrize("canary, report", [
    ("canary_asan", "ERROR: AddressSanitizer: heap-buffer-overflow"),
    ("canary_ubsan", "runtime error: signed integer overflow"),
], ids=["asan", "ubsan"])
def test_a_planted_bug_is_reported_with_a_reproducer_that_replays(driver, canary, report):
    proc = run(driver, canary, "--inputs", "1000", "--seed", "7")
    assert proc.returncode != 0 and report in proc.stderr, proc.stderr[-3000:]
    assert f"reproducer: target={canary} seed=7 input#=" in proc.stderr, proc.stderr[-3000:]
    replay = re.search(r"^replay: fuzz_decoders (--replay \S+ \S+)$", proc.stderr, re.M)
    again = run(driver, *replay.group(1).split())
    assert again.returncode != 0 and report in again.stderr, again.stderr[-3000:]


def test_an_input_that_never_returns_is_reported_as_a_hang(driver):
    proc = run(driver, "canary_hang", "--inputs", "10", "--hang-seconds", "1", timeout=60)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "hang: the input ran past the hang limit" in proc.stderr
    assert re.search(r"^replay: fuzz_decoders --replay canary_hang \S+$", proc.stderr, re.M)
