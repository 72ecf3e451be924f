"""Packaging: the editable install maps kernel/ and widgets/ under hvd_magic (a wheel also
carries notebooks/ as hvd_magic/notebooks), installs nothing generic at top level, the
extension's explicit source list matches engine_native/csrc, and the sdist carries what a build
needs. (What a wheel carries is checked on the built wheel: .ci/check_wheel.py.)"""
import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CSRC = os.path.join(REPO, "engine_native", "csrc")

_PROBE = r"""
import importlib.util, json, sys
out = {}
for name in ("hvd_magic.kernel", "hvd_magic.widgets", "engine_native", "engine_native.torch",
             "kernel", "widgets"):
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:
        spec = None
    if spec is None:
        out[name] = None
    else:
        out[name] = list(spec.submodule_search_locations or []) or [spec.origin]
import engine_native._core as core
out["_core"] = [core.__file__]
print(json.dumps(out))
"""


def _installed():
    """The installed distribution, not the build's leftover ``hvd_magic.egg-info`` in the
    checkout (found first when the repository root is on sys.path; it lists every source)."""
    repo = os.path.realpath(REPO)
    for dist in importlib.metadata.distributions(name="hvd-magic"):
        if os.path.realpath(str(dist.locate_file(""))) != repo:
            return dist
    return None


def _require_installed():
    dist = _installed()
    assert dist is not None, "hvd-magic is not installed (run ./dev.sh test, or pip install -e .)"
    return dist


@pytest.fixture(scope="module")
def locations(tmp_path_factory):
    _require_installed()
    cwd = tmp_path_factory.mktemp("elsewhere")  # the repo must not be on sys.path
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", _PROBE], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _inside(paths, folder):
    target = os.path.realpath(os.path.join(REPO, folder))
    return bool(paths) and all(os.path.realpath(p) == target or
                               os.path.realpath(p).startswith(target + os.sep) for p in paths)


@pytest.mark.parametrize("package, folder", [("hvd_magic.kernel", "kernel"),
                                             ("hvd_magic.widgets", "widgets")])
def test_mapped_packages_resolve_to_top_level_folders(locations, package, folder):
    assert os.path.exists(os.path.join(REPO, folder, "__init__.py")), f"{folder}/__init__.py"
    assert _inside(locations[package], folder), f"{package} -> {locations[package]}"


def test_the_demo_finds_its_notebook():
    """A wheel carries notebooks/ as data in hvd_magic/notebooks, where ``python -m
    hvd_magic.demo`` looks first; a checkout has them at the top level."""
    from hvd_magic import demo

    assert demo.DEFAULT_NOTEBOOK.exists(), demo.DEFAULT_NOTEBOOK


def test_the_sdist_carries_the_headers_and_notebooks():
    """setup.py lists only the .cc files; without MANIFEST.in an sdist has no header and
    cannot build (python -m build builds its wheel from the sdist)."""
    lines = [line.split() for line in open(os.path.join(REPO, "MANIFEST.in"))
             if line.strip() and not line.startswith("#")]
    assert ["recursive-include", "engine_native/csrc", "*.h", "*.cc"] in lines
    assert ["recursive-include", "notebooks", "*.ipynb"] in lines


def test_engine_native_and_its_torch_subpackage_resolve_into_the_repo(locations):
    assert _inside(locations["engine_native"], "engine_native")
    assert _inside(locations["engine_native.torch"], os.path.join("engine_native", "torch"))
    assert _inside(locations["_core"], "engine_native"), locations["_core"]


@pytest.mark.parametrize("generic", ["kernel", "widgets"])
def test_no_generic_top_level_package_installed(locations, generic):
    # A PyPI package of that name may exist in the environment; ours must not be it.
    found = locations[generic]
    assert found is None or not any(
        os.path.realpath(p).startswith(os.path.realpath(REPO) + os.sep) for p in found), found


def test_distribution_declares_no_generic_top_level_names():
    dist = _require_installed()
    top = set((dist.read_text("top_level.txt") or "").split())
    assert not top & {"kernel", "widgets", "tests"}, top
    for entry in dist.files or []:
        first = str(entry).split("/")[0]
        assert first not in ("kernel", "widgets", "tests"), entry


def _listed_sources():
    tree = ast.parse(open(os.path.join(REPO, "setup.py")).read())
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                getattr(t, "id", None) == "CORE_SOURCES" for t in node.targets):
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no CORE_SOURCES list")


def test_extension_source_list_matches_csrc():
    listed = _listed_sources()
    assert len(listed) == len(set(listed)), "a source is listed twice"
    on_disk = sorted(os.path.relpath(os.path.join(d, f), CSRC)
                     for d, _, files in os.walk(CSRC) for f in files if f.endswith(".cc"))
    assert sorted(listed) == on_disk, (
        f"not listed in setup.py: {sorted(set(on_disk) - set(listed))}; "
        f"listed but missing: {sorted(set(listed) - set(on_disk))}")


def test_product_extension_carries_no_test_hooks():
    """The hooks on a standalone Timeline / ParameterManager are the _testhooks module's,
    built by tests/native/build_testhooks.py; the shipped _core has none of them."""
    from engine_native import _core

    hooks = [n for n in dir(_core) if "ForTest" in n or n in ("autotune_maximize",
                                                                "gp_fit_predict")]
    assert hooks == [], f"test hooks compiled into engine_native._core: {hooks}"
    assert not any(s.startswith(("tests/", "testhooks/")) for s in _listed_sources())


def test_core_includes_no_framework_or_vendor_headers():
    forbidden = re.compile(r'#\s*include\s*[<"](torch/|ATen/|c10/|cuda|cuda_runtime|nccl|mpi\.h'
                           r'|pybind11|Python\.h)')
    offenders = []
    for d, _, files in os.walk(CSRC):
        for f in files:
            if not f.endswith((".cc", ".h")):
                continue
            path = os.path.join(d, f)
            rel = os.path.relpath(path, CSRC)
            for n, line in enumerate(open(path, errors="replace"), 1):
                m = forbidden.search(line)
                if m and not (m.group(1) == "Python.h" and rel.startswith("bindings")):
                    offenders.append(f"{rel}:{n}: {line.strip()}")
    assert not offenders, "\n".join(offenders)
