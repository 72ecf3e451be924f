"""The core's reduction kernel source through the real NVRTC (no GPU needed): it compiles for
sm_80 and sm_90 to PTX and to cubins, every kernel is in the output, and a broken source's
error carries NVRTC's log. Needs the ``nvidia-cuda-nvrtc-cu12`` wheel (the ``test`` extra pins
it); without it the test skips locally and fails in CI (``CI=true``). Runs in a subprocess:
the core loads one NVRTC per process, and test_device_kernels.py loads the fake one."""
import glob
import os
import site
import subprocess
import sys

import pytest

NAMES = [f"hvd_reduce_{d}_{o}" for d in ("uint8", "int8", "int16", "int32", "int64", "float16",
                                         "bfloat16", "float32", "float64", "bool")
         for o in ("sum", "min", "max", "product")]

SCRIPT = r"""
import sys
from native.build_testhooks import load
h = load()
h.device_kernels_set_candidates([sys.argv[1]], [])
for major, minor in ((8, 0), (9, 0)):
    ptx = h.compile_reduce_kernels(major, minor, True).rstrip(b"\0").decode()
    cubin = h.compile_reduce_kernels(major, minor, False)
    print(major, minor, cubin[:4] == b"\x7fELF", " ".join(
        line.split()[-1].rstrip("(") for line in ptx.splitlines() if ".entry" in line))
try:
    h.nvrtc_compile('extern "C" __global__ void k(int a) { no_such_function(a); }',
                    ["--gpu-architecture=sm_90"], False)
except RuntimeError as e:
    print("ERROR", str(e).replace("\n", " | "))
"""


def nvrtc_library():
    for sp in site.getsitepackages() + [site.getusersitepackages()]:
        pattern = os.path.join(sp, "nvidia", "cuda_nvrtc", "lib", "libnvrtc.so.1*")
        found = sorted(glob.glob(pattern))
        if found:
            return found[0]
    return None


def test_the_kernel_source_compiles_with_the_real_nvrtc_for_sm80_and_sm90():
    library = nvrtc_library()
    if library is None:
        message = "the nvidia-cuda-nvrtc-cu12 wheel is not installed (pip install -e '.[test]')"
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(message)
        pytest.skip(message)
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", SCRIPT, library], capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": tests_dir})
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    for line, arch in zip(lines[:2], ("8 0", "9 0")):
        major, minor, is_elf, *entries = line.split()
        assert f"{major} {minor}" == arch and is_elf == "True", line
        assert sorted(entries) == sorted(NAMES), line
    assert lines[2].startswith("ERROR") and "NVRTC_ERROR_COMPILATION" in lines[2], lines[2]
    assert "no_such_function" in lines[2] and "NVRTC log" in lines[2], lines[2]
