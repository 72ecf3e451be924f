"""Test-suite wide configuration: tier markers and skipping tests whose requirement is missing.

Markers (registered in pyproject.toml):

- ``gpu``: needs a CUDA device (torch.cuda.is_available()); skipped otherwise.
- ``browser``: needs headless Chromium, Playwright, JupyterLab and ipywidgets' lab extension
  (``.ci/install-browser.sh``); skipped otherwise.
- ``spark``: needs pyspark and a Java runtime; skipped otherwise.
- ``mpi``: needs mpiexec (the PyPI mpich wheel's, or a system one) and mpi4py; skipped otherwise.
- ``multiproc`` / ``mpi`` / ``cluster`` are added automatically to tests in those folders, so
  ``pytest -m "not cluster"`` selects tiers.

Set ``HVD_REQUIRE=gpu,mpi,...`` to turn a missing requirement into a failure instead of a skip
(for machines that are supposed to have it; ``.ci/run`` requires every tier it installs). The
checks live in ``tests/tiers.py``. Nothing else skips for a missing package: the project's own
modules and the ``test`` extra's packages are imported directly, so a broken install fails.
"""
import os

import pytest

import tier_times
import tiers  # tests/ is on sys.path (rootdir-relative import)

TESTS = os.path.dirname(os.path.abspath(__file__))
_FOLDER_MARKERS = {"multiproc": "multiproc", "mpi": "mpi", "cluster": "cluster",
                   "multihost": "multihost"}


def pytest_configure(config):
    try:
        tiers.required()
    except ValueError as exc:
        raise pytest.UsageError(str(exc)) from None
    if not hasattr(config, "workerinput"):  # the table is the whole run's, not a worker's
        config.pluginmanager.register(tier_times.TierTimes(), "hvd-tier-times")


# Under pytest-xdist (./dev.sh test runs two workers) each of these tiers runs whole in one
# worker, first: its tests share something one per process (the IPython shell and its
# cluster; the network-namespace hosts; a JupyterLab; an mpiexec'd cluster), and the longest
# goes first so the other worker spends that time on the rest. Every other test file is a unit
# of its own, run where a worker is free; the unit tier's short files last, to fill the end.
# Files that share a session fixture one per process are one unit (_SHARED: the Spark JVM).
_WHOLE_TIERS = ("cluster", "multihost", "browser", "mpi")
_LAST_TIERS = ("unit",)
_SHARED = {"launch/test_spark.py": "launch/spark", "launch/test_spark_estimator.py": "launch/spark"}


def _distribute(config, items):
    if not getattr(config.option, "loadgroup", False):
        return
    def rank(item):
        rel = os.path.relpath(str(item.path), TESTS).split(os.sep)
        tier = rel[0] if len(rel) > 1 else ""
        if tier in _WHOLE_TIERS:
            item.add_marker(pytest.mark.xdist_group(tier))
            return _WHOLE_TIERS.index(tier)
        unit = "/".join(rel)
        item.add_marker(pytest.mark.xdist_group(_SHARED.get(unit, unit)))
        return len(_WHOLE_TIERS) + (tier in _LAST_TIERS)
    items.sort(key=rank)  # stable: the order within a unit stays the collection's


@pytest.hookimpl(tryfirst=True)  # before xdist turns the groups into node ids
def pytest_collection_modifyitems(config, items):
    _distribute(config, items)
    required = tiers.required()
    for item in items:
        rel = os.path.relpath(str(item.path), TESTS).split(os.sep)
        if len(rel) > 1 and rel[0] in _FOLDER_MARKERS:
            item.add_marker(_FOLDER_MARKERS[rel[0]])
        for name in tiers.TIERS:
            if item.get_closest_marker(name) is None:
                continue
            why = tiers.missing(name)
            if why is None:
                continue
            if name in required:
                item._hvd_missing = f"HVD_REQUIRE={name} but {why}"
            else:
                item.add_marker(pytest.mark.skip(reason=f"{name}: {why}"))


def pytest_runtest_setup(item):
    missing = getattr(item, "_hvd_missing", None)
    if missing:
        pytest.fail(missing, pytrace=False)
