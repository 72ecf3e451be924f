"""Test-suite wide configuration: tier markers and skipping tests whose requirement is missing.

Markers (registered in pyproject.toml):

- ``gpu``: needs a CUDA device (torch.cuda.is_available()); skipped otherwise.
- ``browser``: needs headless Chromium and Playwright; skipped otherwise.
- ``spark``: needs pyspark and a Java runtime; skipped otherwise.
- ``mpi``: needs mpiexec (the PyPI mpich wheel's, or a system one) and mpi4py; skipped otherwise.
- ``multiproc`` / ``mpi`` / ``cluster`` are added automatically to tests in those folders, so
  ``pytest -m "not cluster"`` selects tiers.

Set ``HVD_REQUIRE=gpu,mpi,...`` to turn a missing requirement into a failure instead of a skip
(for machines that are supposed to have it).
"""
import functools
import importlib.util
import os
import shutil
import subprocess
import sys

import pytest

TESTS = os.path.dirname(os.path.abspath(__file__))
_FOLDER_MARKERS = {"multiproc": "multiproc", "mpi": "mpi", "cluster": "cluster"}


@functools.lru_cache(maxsize=None)
def _missing_gpu():
    if importlib.util.find_spec("torch") is None:
        return "torch is not installed"
    code = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"
    try:  # a subprocess: importing torch + CUDA init stays out of the test process
        ok = subprocess.run([sys.executable, "-c", code], capture_output=True,
                            timeout=120).returncode == 0
    except subprocess.TimeoutExpired:
        ok = False
    return None if ok else "no CUDA GPU available"


def _chromium():
    for name in (os.environ.get("HVD_CHROMIUM", ""), "chromium", "chromium-browser",
                 "google-chrome", "google-chrome-stable"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


@functools.lru_cache(maxsize=None)
def _missing_browser():
    if _chromium() is None:
        return "no Chromium executable (apt-get install chromium, or set HVD_CHROMIUM)"
    if importlib.util.find_spec("playwright") is None:
        return "playwright is not installed (pip install playwright)"
    return None


@functools.lru_cache(maxsize=None)
def _missing_spark():
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed"
    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        return "no Java runtime for Spark"
    return None


@functools.lru_cache(maxsize=None)
def _missing_mpi():
    from multiproc.harness import find_mpiexec  # tests/ is on sys.path (rootdir-relative import)

    if find_mpiexec() is None:
        return "mpiexec not found (pip install mpich, or install a system MPI)"
    if importlib.util.find_spec("mpi4py") is None:
        return "mpi4py is not installed"
    return None


_REQUIREMENTS = {"gpu": _missing_gpu, "browser": _missing_browser, "spark": _missing_spark,
                 "mpi": _missing_mpi}


def pytest_collection_modifyitems(config, items):
    required = {r.strip() for r in os.environ.get("HVD_REQUIRE", "").split(",") if r.strip()}
    for item in items:
        rel = os.path.relpath(str(item.path), TESTS).split(os.sep)
        if len(rel) > 1 and rel[0] in _FOLDER_MARKERS:
            item.add_marker(_FOLDER_MARKERS[rel[0]])
        for name, missing in _REQUIREMENTS.items():
            if item.get_closest_marker(name) is None:
                continue
            why = missing()
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
