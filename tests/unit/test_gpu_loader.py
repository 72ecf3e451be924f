"""engine_native.gpu and the core's NCCL / CUDA-runtime loader, on machines without a GPU.

Fakes replace what is searched, never the loader: tiny shared libraries built with the C compiler
at test time (an NCCL reporting an old version, one missing symbols, a corrupt file, ...) are laid
out as the nvidia-nccl-cu12 wheel, torch/lib and the system loader path would hold them, and the
core's real dlopen/dlsym code runs on them. Loading is once per process: loads run in a fresh one.
"""
import json
import os
import pathlib
import random
import re
import shutil
import subprocess
import sys

import pytest

import engine_native
from engine_native import _core, gpu

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(engine_native.__file__)))
CC = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
needs_loader = pytest.mark.usefixtures("loader_prerequisites")  # a failure, never a skip


@pytest.fixture  # every core has the loader, and building the core needed a compiler
def loader_prerequisites():
    assert hasattr(_core, "nccl_load") and CC, "_core lacks nccl_load (rebuild it), or no cc"

# The symbols the loader binds besides the version entry points (its bind(...) calls).
_BOUND = re.findall(r'bind\("(\w+)"', (pathlib.Path(__file__).parents[2] / "engine_native" /
                    "csrc" / "transport" / "nccl" / "loader.cc").read_text())
NCCL_SYMBOLS = [n for n in _BOUND if n.startswith("nccl")]
CUDART_SYMBOLS = [n for n in _BOUND if n.startswith("cuda")]
WHEEL = os.path.join("nvidia", "nccl", "lib", "libnccl.so.2")
CUDART = "cuda_runtime_load"


@pytest.fixture(scope="module")
def build(tmp_path_factory):
    """build(dest, version=..., omit=(), cudart=False, result=0, version_symbol=True)."""
    cache_dir = tmp_path_factory.mktemp("fakelibs")
    cache = {}

    def make(dest, version=21800, omit=(), cudart=False, result=0, version_symbol=True):
        key = (version, tuple(omit), cudart, result, version_symbol)
        if key not in cache:
            vsym = "cudaRuntimeGetVersion" if cudart else "ncclGetVersion"
            lines = [f"int {vsym}(int* v) {{ *v = {version}; return {result}; }}"
                     ] if version_symbol else []
            lines += [f"int {s}(void) {{ return 0; }}"
                      for s in (CUDART_SYMBOLS if cudart else NCCL_SYMBOLS) if s not in omit]
            src = cache_dir / f"lib{len(cache)}.c"
            src.write_text("\n".join(lines) + "\n")
            out = str(src)[:-2] + ".so"
            subprocess.run([CC, "-shared", "-fPIC", "-o", out, str(src)], check=True,
                           timeout=120)
            cache[key] = out
        os.makedirs(os.path.dirname(str(dest)), exist_ok=True)
        shutil.copy(cache[key], dest)
        return str(dest)
    return make


def fresh(code, params=None, env=None):
    """Run ``code`` (which sets ``out``) in a new interpreter; return ``out`` from JSON."""
    script = ("import json, sys\nfrom engine_native import _core, gpu\n"
              "p = json.loads(sys.argv[1])\n" + code + "\nprint(json.dumps(out))\n")
    full_env = {k: v for k, v in os.environ.items()
                if k not in (gpu.NCCL_LIBRARY_ENV, gpu.CUDA_RUNTIME_LIBRARY_ENV)}
    full_env["PYTHONPATH"] = ROOT
    full_env.update(env or {})
    proc = subprocess.run([sys.executable, "-c", script, json.dumps(params or {})],
                          env=full_env, capture_output=True, text=True, timeout=120,
                          check=False)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


SEARCH = "out = gpu.nccl_info(environ=p['environ'], site_dirs=p['sites'], " \
         "torch_lib=p['torch'], conda_prefix='')"


def load(*candidates, fn="nccl_load"):
    """The core's loader on exactly these candidates (no system fallback: machines differ)."""
    return fresh(f"out = _core.{fn}(p['c'])", {"c": [str(c) for c in candidates]})


def search(sites=(), torch=None, environ=None, system_dir=None):
    env = {"LD_LIBRARY_PATH": str(system_dir)} if system_dir else {}
    return fresh(SEARCH, {"environ": environ or {}, "sites": [str(s) for s in sites],
                          "torch": str(torch) if torch else ""}, env)


@pytest.fixture
def layout(tmp_path):
    """A site-packages folder, a torch/lib folder and a 'system' folder for LD_LIBRARY_PATH."""
    site, torch, system = (tmp_path / d for d in ("site", "torch/lib", "system"))
    for d in (site, torch, system):
        d.mkdir(parents=True)
    (site / "nvidia_nccl_cu12-2.20.0.dist-info").mkdir()
    return site, torch, system


# ---- search order --------------------------------------------------------------------------

@needs_loader
def test_explicit_library_wins_over_wheel_torch_and_system(build, layout, tmp_path):
    site, torch, system = layout
    build(site / WHEEL, 22000)
    build(torch / "libnccl.so.2", 21900)
    build(system / "libnccl.so.2", 21800)
    mine = build(tmp_path / "mine" / "libnccl.so.2", 23000)
    info = search([site], torch, {gpu.NCCL_LIBRARY_ENV: mine}, system)
    assert (info["path"], info["version"], info["version_text"]) == (mine, 23000, "2.30.0")
    assert info["source"] == gpu.NCCL_LIBRARY_ENV and info["error"] is None
    assert info["candidates"] == [[mine, gpu.NCCL_LIBRARY_ENV]]


@needs_loader
def test_wheel_before_torch_before_system(build, layout):
    site, torch, system = layout
    wheel = build(site / WHEEL, 22000)
    bundled = build(torch / "libnccl.so.2", 21900)
    sys_lib = build(system / "libnccl.so.2", 21800)
    info = search([site], torch, system_dir=system)
    assert (info["path"], info["version"], info["source"]) == (
        wheel, 22000, "nvidia-nccl-cu12 wheel")
    os.remove(wheel)
    info = search([site], torch, system_dir=system)
    assert (info["path"], info["version"], info["source"]) == (bundled, 21900, "torch")
    assert [wheel, "not found"] in info["rejected"]
    os.remove(bundled)
    info = search([site], torch, system_dir=system)
    assert (info["path"], info["version"], info["source"]) == (sys_lib, 21800, "system")


@needs_loader
def test_unusable_wheel_falls_through_to_torch_and_is_reported(build, layout):
    site, torch, _ = layout
    wheel = build(site / WHEEL, 2804)
    bundled = build(torch / "libnccl.so.2", 21900)
    info = search([site], torch)
    assert info["path"] == bundled
    reasons = dict(map(tuple, info["rejected"]))
    assert "NCCL 2.8.4 (version code 2804)" in reasons[wheel]


# ---- failure paths: the error names the path, the version and the fix ----------------------

@needs_loader
@pytest.mark.parametrize("code, text", [(2804, "2.8.4"), (20903, "2.9.3")])
def test_too_old_nccl_names_path_and_version(build, layout, code, text):
    wheel = build(layout[0] / WHEEL, code)
    info = fresh("out = _core.nccl_load(p['c']); out['after'] = _core.nccl_version()",
                 {"c": [wheel]})
    assert info["path"] is None and info["version"] == 0 and info["after"] == 0
    assert (f"{wheel} is NCCL {text} (version code {code}); this core needs NCCL 2.10.0 or "
            "newer") in info["error"]
    assert 'pip install "hvd-magic[gpu]"' in info["error"]


@needs_loader
def test_missing_symbols_names_path_version_and_symbols(build, layout):
    wheel = build(layout[0] / WHEEL, 21805, omit=("ncclAllReduce", "ncclSend"))
    info = load(wheel)
    assert f"{wheel} is NCCL 2.18.5 (version code 21805) but lacks ncclAllReduce, ncclSend" \
        in info["error"]


@needs_loader
@pytest.mark.parametrize("content", [b"", b"\x7fELF garbage" * 100,
                                     random.Random(4096).randbytes(4096)],
                         ids=["empty", "elf-header-only", "random"])  # ids the same everywhere
def test_corrupt_file_is_a_clear_error_not_a_crash(layout, content):
    site, _, _ = layout
    path = site / WHEEL
    path.parent.mkdir(parents=True)
    path.write_bytes(content)
    info = load(path)
    assert info["path"] is None
    assert info["error"].startswith(f"No usable NCCL: {path} cannot be loaded: ")


@needs_loader
def test_library_without_nccl_get_version_is_not_nccl(build, layout):
    wheel = build(layout[0] / WHEEL, version_symbol=False)
    assert f"{wheel} is not NCCL (it has no ncclGetVersion)" in load(wheel)["error"]


@needs_loader
def test_failing_nccl_get_version_is_reported(build, layout):
    wheel = build(layout[0] / WHEEL, 21800, result=3)
    assert f"{wheel} ncclGetVersion failed (error 3)" in load(wheel)["error"]


@needs_loader
def test_explicit_library_never_falls_back(build, layout, tmp_path):
    site, _, _ = layout
    build(site / WHEEL, 22000)
    old = build(tmp_path / "old" / "libnccl.so.2", 2804)
    info = search([site], environ={gpu.NCCL_LIBRARY_ENV: old})
    assert info["path"] is None
    assert info["error"].startswith(f"{gpu.NCCL_LIBRARY_ENV}={old} is set but unusable")
    assert "2.8.4 (version code 2804)" in info["error"]


@needs_loader
def test_nothing_found_says_what_to_install(tmp_path):
    missing = [str(tmp_path / "a" / WHEEL), str(tmp_path / "torch" / "libnccl.so.2")]
    result = load(*missing)
    assert result["path"] is None and result["version"] == 0
    assert result["error"].startswith(f"NCCL was not found (looked for {missing[0]}, "
                                      f"{missing[1]}).")
    assert all(fix in result["error"] for fix in (
        'pip install "hvd-magic[gpu]"', "nvidia-nccl-cu12", "PyTorch build", "HVD_NCCL_LIBRARY"))
    assert [tuple(r) for r in result["rejected"]] == [(m, "not found") for m in missing]


@needs_loader
def test_none_usable_is_one_message_naming_every_candidate_and_why(build, tmp_path):
    old = build(tmp_path / "old" / "libnccl.so.2", 2804)
    partial = build(tmp_path / "partial" / "libnccl.so.2", 21805, omit=("ncclSend",))
    corrupt = tmp_path / "corrupt" / "libnccl.so.2"
    corrupt.parent.mkdir()
    corrupt.write_bytes(b"\x7fELF garbage")
    missing = [str(tmp_path / "none" / "libnccl.so.2"), "libnccl-nonexistent.so.2"]
    result = load(missing[0], old, partial, corrupt, missing[1])
    assert [r[0] for r in result["rejected"]] == [missing[0], old, partial, str(corrupt),
                                                  missing[1]]
    assert re.fullmatch(
        re.escape(f"No usable NCCL: {old} is NCCL 2.8.4 (version code 2804); this core needs "
                  f"NCCL 2.10.0 or newer; {partial} is NCCL 2.18.5 (version code 21805) but "
                  f"lacks ncclSend; {corrupt} cannot be loaded: ") + ".+"
        + re.escape(f". Also looked for {missing[0]}, {missing[1]}. CUDA tensors need NCCL "
                    "2.10 or newer: ") + ".+" + re.escape("or set HVD_NCCL_LIBRARY to the path "
                                                         "of a libnccl.so.2."),
        result["error"]), result["error"]


@needs_loader
def test_require_nccl_raises_runtime_error_with_the_fix(tmp_path):
    out = fresh("try:\n    gpu.require_nccl()\n    out = None\n"
                "except RuntimeError as exc:\n    out = str(exc)",
                env={gpu.NCCL_LIBRARY_ENV: str(tmp_path / "nope.so")})
    assert out.startswith(f"{gpu.NCCL_LIBRARY_ENV}={tmp_path / 'nope.so'} is set but unusable")
    assert 'pip install "hvd-magic[gpu]"' in out


@needs_loader
def test_loaded_once_per_process_and_reported_by_nccl_version(build, tmp_path):
    first = build(tmp_path / "one" / "libnccl.so.2", 22703)
    second = build(tmp_path / "two" / "libnccl.so.2", 23000)
    out = fresh("a = _core.nccl_load([p['first']]); b = _core.nccl_load([p['second']])\n"
                "out = [a['path'], b['path'], _core.nccl_version(), _core.nccl_state()['path']]",
                {"first": first, "second": second})
    assert out == [first, first, 22703, first]


@needs_loader
def test_binding_rejects_non_list_arguments():
    with pytest.raises(TypeError, match="list of str"):
        _core.nccl_load("libnccl.so.2")
    with pytest.raises(TypeError, match=r"candidate_paths\[1\]"):
        _core.nccl_load(["/x/libnccl.so.2", 3])


@needs_loader
def test_cuda_runtime_loader(build, tmp_path):
    site = tmp_path / "site"
    good = build(site / "nvidia" / "cuda_runtime" / "lib" / "libcudart.so.12", 12040,
                 cudart=True)
    info = fresh("out = gpu.cuda_runtime_info(environ={}, site_dirs=p['sites'], torch_lib='', "
                 "conda_prefix='')", {"sites": [str(site)]})
    assert (info["path"], info["version"], info["version_text"]) == (good, 12040, "12.4")
    old = build(tmp_path / "old" / "libcudart.so.12", 10020, cudart=True)
    assert (f"No usable CUDA runtime: {old} is the CUDA runtime 10.2 (version code 10020); "
            "this core needs the CUDA runtime 11.0 or newer") in load(old, fn=CUDART)["error"]
    partial = build(tmp_path / "partial" / "libcudart.so.12", 12040, cudart=True,
                    omit=("cudaMemcpyAsync",))
    assert "12.4 (version code 12040) but lacks cudaMemcpyAsync" in load(
        partial, fn=CUDART)["error"]


# ---- candidate lists (pure Python) ---------------------------------------------------------

def test_nccl_candidate_order(tmp_path):
    a, b, torch, conda = (tmp_path / n for n in ("a", "b", "torch_lib", "conda"))
    for d in (a, b, torch):
        d.mkdir()
    (a / "nvidia_nccl_cu12-2.27.3.dist-info").mkdir()
    for name in ("libnccl-1a2b.so.2", "libnccl.so.2"):
        (torch / name).write_bytes(b"")
    got = gpu.nccl_candidates(environ={}, site_dirs=[str(a), str(b)], torch_lib=str(torch),
                              conda_prefix=str(conda))
    cu13 = os.path.join("nvidia", "cu13", "lib", "libnccl.so.2")
    assert got == [
        (os.path.join(a, WHEEL), "nvidia-nccl-cu12 wheel"),
        (os.path.join(b, WHEEL), "nvidia-nccl wheel"),
        (os.path.join(a, cu13), "CUDA-13 NCCL wheel (nvidia/cu13 layout)"),
        (os.path.join(b, cu13), "CUDA-13 NCCL wheel (nvidia/cu13 layout)"),
        (os.path.join(torch, "libnccl.so.2"), "torch"),
        (os.path.join(torch, "libnccl-1a2b.so.2"), "torch"),
        (os.path.join(conda, "lib", "libnccl.so.2"), "conda"),
        ("libnccl.so.2", "system")]
    explicit = gpu.nccl_candidates(environ={gpu.NCCL_LIBRARY_ENV: "/opt/x/libnccl.so.2"},
                                   site_dirs=[str(a)], torch_lib=str(torch))
    assert explicit == [("/opt/x/libnccl.so.2", gpu.NCCL_LIBRARY_ENV)]


def test_cuda_runtime_candidate_order(tmp_path):
    got = gpu.cuda_runtime_candidates(environ={}, site_dirs=[str(tmp_path)], torch_lib="",
                                      conda_prefix="")
    paths = [c.path for c in got]
    assert paths[:2] == [str(tmp_path / "nvidia/cuda_runtime/lib/libcudart.so.12"),
                         str(tmp_path / "nvidia/cu13/lib/libcudart.so.13")]
    assert paths[-2:] == ["libcudart.so.12", "libcudart.so.13"]


def test_device_kernel_candidates_and_their_overrides(tmp_path):
    wheel = tmp_path / "nvidia" / "cuda_nvrtc" / "lib" / "libnvrtc.so.12"
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"")
    assert gpu.device_kernel_candidates(environ={}, site_dirs=[str(tmp_path)], torch_lib="") == (
        [str(wheel), "libnvrtc.so.13", "libnvrtc.so.12"], ["libcuda.so.1"])
    environ = {gpu.NVRTC_LIBRARY_ENV: " /opt/libnvrtc.so ", gpu.CUDA_DRIVER_LIBRARY_ENV: "/d.so"}
    assert gpu.device_kernel_candidates(environ=environ, site_dirs=[str(tmp_path)],
                                        torch_lib="") == (["/opt/libnvrtc.so"], ["/d.so"])


def test_discovery_never_imports_torch():
    import importlib.util
    out = fresh("gpu.nccl_candidates(); gpu.cuda_runtime_candidates()\n"
                "out = ['torch' in sys.modules, gpu.torch_lib_dir()]")
    spec = importlib.util.find_spec("torch")
    assert out == [False, spec and os.path.join(os.path.dirname(spec.origin), "lib")]


def test_site_packages_dirs_are_this_interpreters():
    import site
    dirs = gpu.site_packages_dirs()
    assert len(dirs) == len(set(dirs))
    assert any(os.path.realpath(p) in dirs for p in site.getsitepackages() if os.path.isdir(p))
