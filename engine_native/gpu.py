"""GPU support for engine_native: where NCCL and the CUDA runtime come from, which GPU a rank uses.

Which GPU a rank uses (:func:`pin_gpu`, :func:`visible_devices`, :class:`GpuDevice`) lives in
:mod:`engine_native.gpu_devices` and is importable from here.

The core is never compiled against CUDA: it loads NCCL and the CUDA runtime with dlopen at
the first CUDA use (DESIGN §3 "Boundary"). Only Python knows where pip put them, so this module
computes the candidate paths and ``engine_native._core`` loads the first usable one. NCCL, in
order:

1. ``HVD_NCCL_LIBRARY`` -- when set, the only candidate (an explicit choice never falls back);
2. the ``nvidia-nccl-cu12`` wheel, ``<site-packages>/nvidia/nccl/lib/libnccl.so.2`` (the
   CUDA-13 ``nvidia-nccl-cu13`` wheel installs the same path); then ``nvidia/cu13/lib``, the
   layout of NVIDIA's other CUDA-13 wheels;
3. the NCCL bundled with the installed torch (``torch/lib/libnccl*.so*``; torch is located,
   never imported); then a conda environment's ``<prefix>/lib``;
4. the system: ``libnccl.so.2`` through the dynamic loader (LD_LIBRARY_PATH, ldconfig).

The CUDA runtime likewise (``HVD_CUDA_RUNTIME_LIBRARY``, ``nvidia/cuda_runtime/lib/
libcudart.so.12``, ``nvidia/cu13/lib/libcudart.so.13``, ``torch/lib/libcudart*``, system).

At the first CUDA tensor ``engine_native.torch`` calls :func:`require_cuda` (the CUDA runtime
must load; NCCL is used when it does). Per process set the core takes NCCL when every member
has a GPU of its own and NCCL, CUDA IPC ("cuda-ipc": the members' buffers mapped into each
other, reductions compiled at run time with NVRTC, :func:`device_kernel_candidates`) when they
all share one GPU, IPC within each GPU and NCCL between one rank per GPU when a set spans GPUs
with several ranks on some, else the staged path through host memory, saying why once; a set
of one rank exchanges nothing ("local": device copies, scaling by the device kernel)
(``HVD_GPU_PATH`` overrides; ``engine_native.metrics()["gpu_paths"]`` shows the choice).

>>> gpu.pin_gpu(local_rank=1, local_size=4)   # before CUDA is initialised: {"device": ...}
>>> gpu.nccl_info()["version"]                 # 23203 for NCCL 2.32.3, as nccl_built()
"""
from __future__ import annotations

import glob
import importlib.util
import os
import site
import sys
from collections.abc import Sequence
from typing import NamedTuple

from .gpu_devices import GpuDevice, pin_gpu, visible_devices  # noqa: F401 (re-exported)

NCCL_LIBRARY_ENV = "HVD_NCCL_LIBRARY"
CUDA_RUNTIME_LIBRARY_ENV = "HVD_CUDA_RUNTIME_LIBRARY"

# Files under site-packages: (path, CUDA major when the layout says it), CUDA major -> path.
_NCCL_WHEEL_FILES = (("nvidia/nccl/lib/libnccl.so.2", None), ("nvidia/cu13/lib/libnccl.so.2", 13))
_CUDART_WHEEL_FILES = {12: "nvidia/cuda_runtime/lib/libcudart.so.12",
                       13: "nvidia/cu13/lib/libcudart.so.13"}


class Candidate(NamedTuple):
    path: str    # a file path, or a bare soname for the system loader
    source: str  # where it comes from, for reports ("nvidia-nccl-cu12 wheel", "torch", ...)


# ---- where to look -------------------------------------------------------------------------

def site_packages_dirs() -> list:
    """Every site-packages folder of this interpreter, in import order, without duplicates."""
    found = []
    try:
        found += site.getsitepackages()
    except AttributeError:  # some virtualenv layouts
        pass
    user = site.getusersitepackages() if site.ENABLE_USER_SITE else None
    found += [user] if user else []
    found += [p for p in sys.path if p.rstrip("/").endswith(("site-packages", "dist-packages"))]
    out = []
    for path in found:
        real = os.path.realpath(path)
        if os.path.isdir(real) and real not in out:
            out.append(real)
    return out


def torch_lib_dir() -> str | None:
    """``torch/lib`` of the installed torch, found without importing torch (None: no torch)."""
    module = sys.modules.get("torch")
    origin = getattr(module, "__file__", None)
    if origin is None:
        try:
            spec = importlib.util.find_spec("torch")
        except (ImportError, ValueError):
            spec = None
        origin = spec.origin if spec is not None else None
    return os.path.join(os.path.dirname(origin), "lib") if origin else None


def _conda_prefix() -> str | None:
    prefix = os.environ.get("CONDA_PREFIX") or sys.prefix
    return prefix if os.path.isdir(os.path.join(prefix, "conda-meta")) else None


def _wheel_label(site_dir: str, prefix: str, fallback: str) -> str:
    """``nvidia-nccl-cu12 wheel`` from the dist-info folders next to the file, if any."""
    try:
        names = sorted(n[:-len(".dist-info")].rsplit("-", 1)[0].replace("_", "-")
                       for n in os.listdir(site_dir)
                       if n.startswith(prefix) and n.endswith(".dist-info"))
    except OSError:
        names = []
    return (" / ".join(names) if names else fallback) + " wheel"


def _torch_libs(torch_lib: str | None, pattern: str, preferred: Sequence[str]) -> list:
    if not torch_lib:
        return []
    paths = sorted(glob.glob(os.path.join(torch_lib, pattern)))
    first = [p for p in paths if os.path.basename(p) in preferred]
    return first + [p for p in paths if p not in first]


def _search_args(environ, site_dirs, torch_lib, conda_prefix):
    environ = os.environ if environ is None else environ
    site_dirs = site_packages_dirs() if site_dirs is None else list(site_dirs)
    torch_lib = torch_lib_dir() if torch_lib is None else torch_lib
    conda_prefix = _conda_prefix() if conda_prefix is None else conda_prefix
    return environ, site_dirs, torch_lib, conda_prefix


def nccl_candidates(environ=None, site_dirs=None, torch_lib=None, conda_prefix=None) -> list:
    """The NCCL search order, as :class:`Candidate` s. Arguments override discovery (tests)."""
    environ, site_dirs, torch_lib, conda_prefix = _search_args(environ, site_dirs, torch_lib,
                                                               conda_prefix)
    explicit = _override(environ, NCCL_LIBRARY_ENV)
    if explicit:
        return explicit
    out = []
    for rel, major in _NCCL_WHEEL_FILES:
        for sp in site_dirs:
            label = ("CUDA-13 NCCL wheel (nvidia/cu13 layout)" if major == 13
                     else _wheel_label(sp, "nvidia_nccl_cu", "nvidia-nccl"))
            out.append(Candidate(os.path.join(sp, rel), label))
    out += [Candidate(p, "torch") for p in _torch_libs(torch_lib, "libnccl*.so*",
                                                       ("libnccl.so.2",))]
    if conda_prefix:
        out.append(Candidate(os.path.join(conda_prefix, "lib", "libnccl.so.2"), "conda"))
    out.append(Candidate("libnccl.so.2", "system"))
    return _unique(out)


def cuda_runtime_candidates(environ=None, site_dirs=None, torch_lib=None,
                            conda_prefix=None) -> list:
    """The CUDA runtime search order (libcudart), as :class:`Candidate` s. CUDA 12 comes
    first unless an already-imported torch was built for CUDA 13."""
    environ, site_dirs, torch_lib, conda_prefix = _search_args(environ, site_dirs, torch_lib,
                                                               conda_prefix)
    explicit = _override(environ, CUDA_RUNTIME_LIBRARY_ENV)
    if explicit:
        return explicit
    torch_cuda = str(getattr(getattr(sys.modules.get("torch"), "version", None), "cuda", ""))
    majors = (13, 12) if torch_cuda.startswith("13.") else (12, 13)
    out = [Candidate(os.path.join(sp, _CUDART_WHEEL_FILES[m]), f"nvidia-cuda-runtime wheel "
                     f"(CUDA {m})") for m in majors for sp in site_dirs]
    out += [Candidate(p, "torch") for p in _torch_libs(
        torch_lib, "libcudart*.so*", ("libcudart.so.12", "libcudart.so.13"))]
    if conda_prefix:
        out += [Candidate(os.path.join(conda_prefix, "lib", f"libcudart.so.{m}"), "conda")
                for m in majors]
    return _unique(out + [Candidate(f"libcudart.so.{m}", "system") for m in majors])


def _override(environ, name: str) -> list:
    """``[Candidate(value, name)]`` when the ``HVD_*_LIBRARY`` variable ``name`` is set: then
    the only candidate, since an explicit choice never falls back. Else ``[]``."""
    value = environ.get(name, "").strip()
    return [Candidate(value, name)] if value else []


def _unique(candidates: list) -> list:
    first: dict = {}
    for c in candidates:
        first.setdefault(c.path, c)
    return list(first.values())


# ---- loading -------------------------------------------------------------------------------

def _core():
    from . import _core as core
    return core


_loaded: dict = {}  # fn_name -> info, once a library is loaded (it is never unloaded)


def _load(fn_name: str, candidates: list) -> dict:
    if fn_name in _loaded:
        return dict(_loaded[fn_name])
    fn = getattr(_core(), fn_name)  # nccl_load / cuda_runtime_load: always built in
    sources = {c.path: c.source for c in candidates}
    info = {"loaded": False, "path": None, "version": 0, "version_text": None, "source": None,
            "error": None, "rejected": [], "candidates": [tuple(c) for c in candidates]}
    result = fn([c.path for c in candidates])
    info.update(result)
    info["loaded"] = result["path"] is not None
    if info["loaded"]:
        info["source"] = sources.get(result["path"], "system")  # bare names resolve
        _loaded[fn_name] = dict(info)
    elif candidates and candidates[0].source in (NCCL_LIBRARY_ENV, CUDA_RUNTIME_LIBRARY_ENV):
        info["error"] = (f"{candidates[0].source}={candidates[0].path} is set but unusable "
                         f"(unset it to search the usual places): {result['error']}")
    return info


def nccl_info(**search) -> dict:
    """Load NCCL if it is not loaded yet and describe it.

    Returns
    -------
    dict
        ``loaded``, ``path``, ``version`` (ncclGetVersion's code, e.g. 23203; 0 when none),
        ``version_text`` ("2.32.3"), ``source`` (which search step found it), ``error`` (why
        none was loaded, naming each rejected path and its version, and the fix),
        ``rejected`` [(path, reason)], ``candidates`` [(path, source)]. ``search`` keywords
        override discovery as in :func:`nccl_candidates`.
    """
    return _load("nccl_load", nccl_candidates(**search))


def cuda_runtime_info(**search) -> dict:
    """Load the CUDA runtime if needed and describe it (same keys as :func:`nccl_info`)."""
    return _load("cuda_runtime_load", cuda_runtime_candidates(**search))


def nccl_version() -> int:
    """Version code of the NCCL the core has loaded, 0 when none (never loads anything)."""
    return int(_core().nccl_version())


def require_nccl() -> dict:
    """Load NCCL and the CUDA runtime; return :func:`nccl_info`. RuntimeError, naming every
    rejected library (path and version) and what to install, when either is missing."""
    infos = [nccl_info(), cuda_runtime_info()]
    for info in infos:
        if not info["loaded"]:
            raise RuntimeError(info["error"])
    return infos[0]


NVRTC_LIBRARY_ENV = "HVD_NVRTC_LIBRARY"
CUDA_DRIVER_LIBRARY_ENV = "HVD_CUDA_DRIVER_LIBRARY"
_NVRTC_WHEEL_FILES = {12: os.path.join("nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.12"),
                      13: os.path.join("nvidia", "cu13", "lib", "libnvrtc.so.13")}


_kernel_candidates_set = False


def device_kernel_candidates(environ=None, site_dirs=None, torch_lib=None) -> tuple:
    """(nvrtc, driver) path lists the device reductions (CUDA IPC path) try in order: the
    HVD_NVRTC_LIBRARY / HVD_CUDA_DRIVER_LIBRARY overrides alone when set, else the
    nvidia-cuda-nvrtc wheels, torch's lib folder, then the system's sonames."""
    environ, site_dirs, torch_lib, _ = _search_args(environ, site_dirs, torch_lib, "")
    nvrtcs = [c.path for c in _override(environ, NVRTC_LIBRARY_ENV)] or (
        [os.path.join(sp, _NVRTC_WHEEL_FILES[m]) for m in (12, 13) for sp in site_dirs]
        + _torch_libs(torch_lib, "libnvrtc*.so*", ("libnvrtc.so.12", "libnvrtc.so.13"))
        + ["libnvrtc.so.13", "libnvrtc.so.12"])
    drivers = [c.path for c in _override(environ, CUDA_DRIVER_LIBRARY_ENV)] or ["libcuda.so.1"]
    return [c for c in nvrtcs if "/" not in c or os.path.exists(c)] or nvrtcs, drivers


MULTI_RANK_GPU_ENV = "NCCL_MULTI_RANK_GPU_ENABLE"


def prepare_nccl_environment(environ=os.environ) -> None:
    """Under ``HVD_GPU_PATH=nccl``, let NCCL 2.30+ take two ranks that share a GPU
    (``NCCL_MULTI_RANK_GPU_ENABLE=1``, for the whole process; NCCL switches NVLS off under it)
    unless the user set that variable (Note [Device path choice] F). ``init()`` calls this
    before the core reads its configuration and starts its thread; NCCL reads the variable at
    communicator set-up."""
    if environ.get("HVD_GPU_PATH", "").strip().lower() == "nccl":
        environ.setdefault(MULTI_RANK_GPU_ENV, "1")


def require_cuda() -> dict:
    """At the first CUDA tensor: load the CUDA runtime (needed) and NCCL (used if it loads).

    Returns :func:`cuda_runtime_info`. Raises RuntimeError, naming every rejected library and
    what to install, when no usable CUDA runtime is found. Without NCCL, CUDA collectives take
    the staged path through host memory; the core says so once per process set, naming the
    reason (:func:`nccl_info` has the details). Cheap once loaded.
    """
    runtime = cuda_runtime_info()
    if not runtime["loaded"]:
        raise RuntimeError(runtime["error"])
    nccl_info()
    global _kernel_candidates_set
    if not _kernel_candidates_set:
        _core().device_kernel_candidates(*device_kernel_candidates())
        _kernel_candidates_set = True
    return runtime
