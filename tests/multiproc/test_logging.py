"""The core's environment on spawned ranks: HVD_LOG_SUBSYS narrows info lines to the named
subsystems (warnings always pass), and a malformed HVD_* value warns once, naming the variable,
the value and the default used instead, which is then what the core runs with."""
import re

import numpy as np

from multiproc import checks
from multiproc.harness import run_ranks

TRANSPORT_LINE = re.compile(r"^\[hvd rank 0\] info transport: rank 0 -> 1 via shm", re.M)
RUNTIME_LINE = re.compile(r"^\[hvd rank 0\] info runtime: initialised: rank 0 of 2", re.M)
BAD_CYCLE = ("HVD_CYCLE_TIME_MS='fast' is not valid (expected a number >= 0); using the default "
             "1 instead")


def init_twice():
    """Two core lifetimes in one process: the environment is read at each init()."""
    hvd = checks.init("shm")
    for attempt in range(2):
        if attempt:
            hvd.init()
        out = hvd.allreduce(np.ones(3), op=hvd.Sum, name=f"x{attempt}")
        assert np.all(out == hvd.size()), out
        applied = hvd.autotune_state()["applied"]
        hvd.shutdown()
    return applied


def test_log_subsys_keeps_only_the_named_subsystems_info_lines():
    res = run_ranks(init_twice, 2, timeout=60,
                    env={"HVD_LOG": "info", "HVD_LOG_SUBSYS": " Transport,algo "})
    err = res[0].stderr
    assert TRANSPORT_LINE.search(err), err[-3000:]
    assert not RUNTIME_LINE.search(err), "runtime's info line passed a transport,algo filter"
    assert not re.search(r"^\[hvd rank \d\] info (?!transport|algo)", err, re.M), err[-3000:]

    res = run_ranks(init_twice, 2, timeout=60,
                    env={"HVD_LOG": "info", "HVD_LOG_SUBSYS": "runtime"})
    err = res[0].stderr
    assert RUNTIME_LINE.search(err), err[-3000:]
    assert not TRANSPORT_LINE.search(err), "transport's info line passed a runtime filter"


def test_a_malformed_value_warns_once_and_the_default_is_used():
    # The filter names another subsystem: warnings pass it all the same.
    res = run_ranks(init_twice, 2, timeout=60,
                    env={"HVD_CYCLE_TIME_MS": "fast", "HVD_LOG_SUBSYS": "transport"})
    for r in res:
        assert r.stderr.count(BAD_CYCLE) == 1, (r.rank, r.stderr[-3000:])  # two inits, once
        assert f"warning config: {BAD_CYCLE}" in r.stderr  # read before the rank is known
        assert r.value["cycle_time_ms"] == 1.0, r.value  # what the core ran with
