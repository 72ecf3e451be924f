"""Compile the fake CUDA runtime and the fake NCCL (the C files beside this module).

All land in one folder: ``libcudart.so.12``, ``libnccl.so.2``, and for the device kernels
``libnvrtc.so.12`` (compiles kernel source for the CPU) and ``libcuda.so.1`` (runs it on the fake
streams). NCCL and the driver list the cudart as DT_NEEDED with RUNPATH ``$ORIGIN``, so a process
that dlopens them (in any order) gets one cudart. The folder is named by a hash of the sources,
flags and compiler, so a second call with the same ``dest_dir`` reuses it. No C compiler is an
error, never a skip.

Example
-------
>>> fake = build_fake_cuda("/tmp/fakecuda")              # doctest: +SKIP
>>> subprocess.run(cmd, env={**os.environ, **fake.env()})  # doctest: +SKIP
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shutil
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
CUDART_SOURCES = ("fake_cudart_stream.c", "fake_cudart_event.c", "fake_cudart_device.c",
                  "fake_cudart_ipc.c")
NCCL_SOURCES = ("fake_nccl.c", "fake_nccl_comm.c", "fake_nccl_exec.c", "fake_nccl_reduce.c")
NVRTC_SOURCES = ("fake_nvrtc.c",)
DRIVER_SOURCES = ("fake_cuda_driver.c",)
HEADERS = ("fake_cudart.h", "fake_nccl.h")
FLAGS = ("-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-pthread",
         "-fvisibility=hidden")
CUDART_NAME = "libcudart.so.12"
NCCL_NAME = "libnccl.so.2"
NVRTC_NAME = "libnvrtc.so.12"
DRIVER_NAME = "libcuda.so.1"


@dataclasses.dataclass(frozen=True)
class FakeCuda:
    """Absolute paths of the fake libraries (same folder): the runtime, NCCL, and the NVRTC and
    driver of the device kernels (which compile kernel source for the CPU and run it there)."""

    cudart: str
    nccl: str
    nvrtc: str = ""
    driver: str = ""

    def env(self) -> dict:
        """The variables that make the core load these instead of a real CUDA/NCCL."""
        return {"HVD_CUDA_RUNTIME_LIBRARY": self.cudart, "HVD_NCCL_LIBRARY": self.nccl,
                "HVD_NVRTC_LIBRARY": self.nvrtc, "HVD_CUDA_DRIVER_LIBRARY": self.driver}


def compiler() -> str:
    """$CC, else cc, else gcc; RuntimeError when there is none."""
    for name in (os.environ.get("CC", ""), "cc", "gcc"):
        found = name and shutil.which(name)
        if found:
            return found
    raise RuntimeError("no C compiler (looked for $CC, cc, gcc): the fake CUDA runtime and "
                       "NCCL are built at test time; install one (apt-get install gcc)")


def _digest(cc: str) -> str:
    h = hashlib.sha256(" ".join((cc,) + FLAGS).encode())
    for name in CUDART_SOURCES + NCCL_SOURCES + NVRTC_SOURCES + DRIVER_SOURCES + HEADERS:
        with open(os.path.join(HERE, name), "rb") as fh:
            h.update(name.encode() + b"\0" + fh.read())
    return h.hexdigest()[:16]


def _compile(cc: str, out_dir: str) -> None:
    def run(args):
        proc = subprocess.run([cc, *FLAGS, *args], cwd=HERE, capture_output=True, text=True,
                              timeout=300, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"building the fake CUDA libraries failed: {' '.join(args)}\n"
                               f"{proc.stdout}{proc.stderr}")
    run(["-Wl,-soname," + CUDART_NAME, "-o", os.path.join(out_dir, CUDART_NAME),
         *CUDART_SOURCES])
    run(["-Wl,-soname," + NCCL_NAME, "-o", os.path.join(out_dir, NCCL_NAME), *NCCL_SOURCES,
         "-L" + out_dir, "-l:" + CUDART_NAME, "-Wl,-rpath,$ORIGIN"])
    run(["-Wl,-soname," + NVRTC_NAME, "-o", os.path.join(out_dir, NVRTC_NAME), *NVRTC_SOURCES,
         "-ldl"])
    run(["-Wl,-soname," + DRIVER_NAME, "-o", os.path.join(out_dir, DRIVER_NAME),
         *DRIVER_SOURCES, "-ldl", "-L" + out_dir, "-l:" + CUDART_NAME, "-Wl,-rpath,$ORIGIN"])


def build_fake_cuda(dest_dir) -> FakeCuda:
    """Build (or reuse) the fakes under ``dest_dir``; return their paths."""
    cc = compiler()
    out = os.path.join(os.path.abspath(str(dest_dir)), "fakecuda-" + _digest(cc))
    fake = FakeCuda(*(os.path.join(out, n) for n in (CUDART_NAME, NCCL_NAME, NVRTC_NAME,
                                                      DRIVER_NAME)))
    if all(os.path.exists(p) for p in (fake.cudart, fake.nccl, fake.nvrtc, fake.driver)):
        return fake
    os.makedirs(os.path.dirname(out), exist_ok=True)
    staging = tempfile.mkdtemp(prefix=".building-", dir=os.path.dirname(out))
    os.chmod(staging, 0o755)
    try:
        _compile(cc, staging)
        try:
            os.rename(staging, out)  # atomic: a concurrent builder's copy may have won
        except OSError:
            if not os.path.exists(fake.driver):
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return fake
