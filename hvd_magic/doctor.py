"""``python -m hvd_magic.doctor``: everything a problem report needs, in one paste.

Prints the versions (hvd-magic, Python, the frameworks, numpy, MPI and the notebook stack),
how this copy was installed and how its core was built, what loads here (MPI, NCCL, the CUDA
runtime and driver, NVRTC, MPS), the transports that follow from that, and the GPUs. Each section is
probed on its own: a missing or broken piece is reported on its line (what is missing and the
fix), never as a traceback, so the report is complete exactly when something is wrong. Nothing
here starts ranks or calls MPI_Init; NCCL and CUDA are loaded as a rank would load them.
"""

from __future__ import annotations

import ctypes
import importlib.util
import json
import mmap
import os
import platform
import shutil
import sys
from importlib import metadata

_DISTS = ("torch", "numpy", "keras", "jax", "jaxlib", "optax", "tensorflow", "mpi4py", "mpich",
          "cloudpickle", "ipyparallel", "ipykernel", "jupyter_client", "ipywidgets", "nbclient")
# A distribution published under other names: the first one installed is reported.
_ALIASES = {"tensorflow": ("tensorflow", "tensorflow-cpu", "tensorflow-gpu")}
_HIDDEN = ("SECRET", "KEY", "TOKEN", "PASSWORD")  # never printed: reports get pasted in public
_COMPILERS = (b"GCC: (", b"clang version ")  # what gcc and clang write into .comment


def _dist_version(name: str) -> str:
    for dist in _ALIASES.get(name, (name,)):
        try:
            version = metadata.version(dist)
        except metadata.PackageNotFoundError:
            continue
        return version if dist == name else f"{version} ({dist})"
    return "not installed"


def versions() -> list:
    try:
        import engine_native
        ours = engine_native.__version__
    except ImportError as exc:  # the core does not load: say so, keep the metadata's version
        ours = f"{_dist_version('hvd-magic')} (engine_native does not import: {exc})"
    return ([f"hvd-magic {ours}", f"python {sys.version.split()[0]} ({sys.executable})",
             f"platform {platform.platform()} ({' '.join(platform.libc_ver())})"]
            + [f"{name} {_dist_version(name)}" for name in _DISTS])


def _compiler_of(path: str) -> str:
    """The compiler named in the library's .comment section ("GCC: (Debian 12.2.0...)")."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
        for marker in _COMPILERS:
            start = data.find(marker)
            if start >= 0:
                return data[start:data.find(b"\0", start)].decode(errors="replace")
    return "unknown"


def install() -> list:
    from engine_native import _core

    dist = metadata.distribution("hvd-magic")
    direct = json.loads(dist.read_text("direct_url.json") or "{}")
    if direct.get("dir_info", {}).get("editable"):
        how = f"editable install of {direct.get('url', '?')} (./dev.sh)"
    else:
        tags = [line.split(":", 1)[1].strip() for line in (dist.read_text("WHEEL") or "")
                .splitlines() if line.startswith("Tag:")]
        source = f" from {direct['url']}" if "url" in direct else ""
        how = (f"wheel {', '.join(tags)}{source}" if tags else  # else a build's egg-info:
               f"a source checkout on sys.path, {os.path.dirname(os.path.dirname(_core.__file__))}")
    switches = ("compiled in (the test build of ./dev.sh; never in a wheel)"
                if getattr(_core, "TEST_SWITCHES", 0) else "none (a release build)")
    return [f"installed as {how}", f"core {_core.__file__}",
            f"core built by {_compiler_of(_core.__file__)}", f"test switches: {switches}"]


def mpi() -> list:
    from .errors import StartError
    from .preflight import check_launcher, mpi4py_library, mpiexec_version

    exe = shutil.which("mpiexec")
    if exe:
        text = mpiexec_version(exe).splitlines() or ["?"]
        said = next((line for line in text if "Version" in line), text[0])
        lines = [f"mpiexec: {exe} ({' '.join(said.split())})"]
    else:
        lines = ["mpiexec: not on PATH"]
    try:
        lines.append("mpi4py loads: " + mpi4py_library(sys.executable).splitlines()[0])
        check_launcher("mpi")
        lines.append("the MPI launcher (%hvd_start's default) can start ranks")
    except StartError as exc:
        lines.append(f"the MPI launcher cannot start ranks: {exc}")
    return lines


def _loaded(label: str, info: dict) -> str:
    if info["loaded"]:
        return (f"{label} {info['version_text'] or info['version']}: {info['path']} "
                f"({info['source']})")
    return f"{label}: not loaded: {info['error'] or 'no candidate found'}"


def _driver_version(path: str) -> str:
    version = ctypes.c_int(0)
    if ctypes.CDLL(path).cuDriverGetVersion(ctypes.byref(version)) != 0:
        return f"CUDA driver: {path} loads but cuDriverGetVersion failed (no usable GPU driver)"
    return f"CUDA driver {version.value // 1000}.{version.value % 1000 // 10}: {path}"


def _nvrtc_version(paths: list) -> str:
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        major, minor = ctypes.c_int(0), ctypes.c_int(0)
        lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
        return f"NVRTC {major.value}.{minor.value}: {path}"
    return ("NVRTC: not found (ranks sharing a GPU then reduce on the staged path): "
            "pip install nvidia-cuda-nvrtc-cu12")


def cuda() -> list:
    from engine_native import gpu

    lines = [_loaded("NCCL", gpu.nccl_info()), _loaded("CUDA runtime", gpu.cuda_runtime_info())]
    nvrtcs, drivers = gpu.device_kernel_candidates()
    try:
        lines.append(_driver_version(drivers[0]))
    except OSError as exc:
        lines.append(f"CUDA driver: not loaded ({exc}); no GPU can be used here")
    lines.append(_nvrtc_version(nvrtcs))
    from .launch import mps

    control = shutil.which(mps.CONTROL)
    pipe = os.environ.get(mps.PIPE_ENV, mps.DEFAULT_PIPE)
    lines.append(f"MPS: {control}; daemon pipe {pipe} "
                 f"{'exists' if os.path.isdir(pipe) else 'absent (no daemon running)'}"
                 if control else f"MPS: {mps.CONTROL} not on PATH (ranks sharing a GPU are "
                 f"time-sliced)")
    return lines


def transports() -> list:
    from engine_native import gpu

    forced = os.environ.get("HVD_TRANSPORT", "")
    lines = ["CPU tensors: shm between ranks of one host, tcp between hosts"
             + (f" (HVD_TRANSPORT={forced} set)" if forced else "")]
    if not gpu.cuda_runtime_info()["loaded"]:
        return lines + ["CUDA tensors: none (no CUDA runtime loads)"]
    try:
        ctypes.CDLL(gpu.device_kernel_candidates()[1][0])
    except OSError:
        return lines + ["CUDA tensors: none (no CUDA driver: no GPU here)"]
    paths = ["nccl (ranks with a GPU each)"] if gpu.nccl_info()["loaded"] else []
    return lines + ["CUDA tensors: " + ", ".join(
        paths + ["cuda-ipc (ranks sharing a GPU)", "staged through host memory"])]


def gpus() -> list:
    from engine_native.gpu import visible_devices

    if importlib.util.find_spec("torch") is not None:
        import torch  # so torch's view counts when nvidia-smi is missing
        lines = [(f"torch CUDA build: {torch.version.cuda or 'none (a CPU build)'}, "
                  f"torch.cuda.is_available(): {torch.cuda.is_available()}")]
    else:
        lines = ["torch: not installed"]
    devices, how = visible_devices()
    if not devices:
        return lines + [f"GPUs: none ({how})"]
    return lines + [f"GPU {d.token}: {d.name or '?'}"
                    + (f", {d.memory_bytes >> 20} MiB" if d.memory_bytes else "")
                    for d in devices] + [f"(from {how})"]


def environment() -> list:
    names = sorted(k for k in os.environ if k.startswith(("HVD_", "HOROVOD_", "CUDA_", "NCCL_")))
    return [f"{k}={'<hidden>' if any(w in k for w in _HIDDEN) else os.environ[k]}"
            for k in names] or ["no HVD_*, HOROVOD_*, CUDA_* or NCCL_* variable set"]


SECTIONS = (("versions", versions), ("install", install), ("MPI", mpi), ("CUDA", cuda),
            ("transports", transports), ("GPUs", gpus), ("environment", environment))


def report() -> str:
    """The whole report as text; a section whose probe fails says why instead."""
    out = ["hvd-magic doctor (paste all of this into a problem report)"]
    for title, probe in SECTIONS:
        try:
            lines = probe()
        except Exception as exc:  # noqa: BLE001 -- one broken probe must not hide the others
            lines = [f"could not check: {type(exc).__name__}: {exc}"]
        out += [f"[{title}]"] + [f"  {line}" for line in lines]
    return "\n".join(out)


def main(argv=None) -> int:
    print(report())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
