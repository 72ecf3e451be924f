"""Per-tier time table at the end of a pytest run (a plugin the root conftest registers).

A tier is a folder directly under ``tests/`` (``unit``, ``multiproc``, ``cluster``, ...); a test
file at the top level counts as ``top``. A test's time is the sum of its setup, call and
teardown phases, so the tiers add up to the run's time spent in tests (collection and session
start-up are the rest). CI's budget is 25 minutes of tests on a 2-core machine: this table is
how a change that grows a tier is seen before it lands.
"""
from __future__ import annotations

import collections
import time

def tier_of(nodeid: str) -> str:
    """``tests/unit/test_x.py::test_y`` -> ``unit`` (node ids are relative to the repository)."""
    parts = nodeid.split("::")[0].split("/")
    return parts[1] if len(parts) > 2 and parts[0] == "tests" else "top"


class TierTimes:
    def __init__(self):
        self.seconds = collections.Counter()
        self.outcomes = collections.defaultdict(collections.Counter)
        self.slowest = collections.defaultdict(lambda: ("", 0.0))
        self.per_test = collections.Counter()
        self.started = time.monotonic()

    def pytest_runtest_logreport(self, report):
        tier = tier_of(report.nodeid)
        self.seconds[tier] += report.duration
        self.per_test[report.nodeid] += report.duration
        if report.when == "call" or (report.when == "setup" and not report.passed):
            self.outcomes[tier][report.outcome] += 1
        if report.when == "teardown" and self.per_test[report.nodeid] > self.slowest[tier][1]:
            self.slowest[tier] = (report.nodeid, self.per_test[report.nodeid])

    def pytest_terminal_summary(self, terminalreporter):
        if not self.seconds:
            return
        write = terminalreporter.write_line
        wall = time.monotonic() - self.started
        terminalreporter.section("time per tier (setup + call + teardown)")
        write(f"{'tier':<11} {'tests':>6} {'passed':>7} {'skipped':>8} {'failed':>7} "
              f"{'seconds':>8} {'share':>6}  slowest test")
        total = sum(self.seconds.values())
        for tier, secs in self.seconds.most_common():
            o = self.outcomes[tier]
            name, slow = self.slowest[tier]
            write(f"{tier:<11} {sum(o.values()):>6} {o['passed']:>7} {o['skipped']:>8} "
                  f"{o['failed']:>7} {secs:>8.1f} {secs / total:>6.1%}  {slow:.1f}s {name}")
        write(f"{'all':<11} {sum(sum(o.values()) for o in self.outcomes.values()):>6} "
              f"{'':>7} {'':>8} {'':>7} {total:>8.1f}   (wall {wall:.0f} s since the start)")
