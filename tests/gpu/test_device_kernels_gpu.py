"""The device reductions on a real GPU: the same checks as tests/unit/test_device_kernels.py
(every dtype x op x nsrcs 1-4 x pre/postscale, aliasing, more than one grid), with the real
NVRTC, found as the core finds it (engine_native.gpu.device_kernel_candidates: the CUDA 12 or
13 wheels, torch's lib), and libcuda, on torch CUDA tensors.
Marker ``gpu``. In a subprocess: the core loads one NVRTC per process (the unit tests load the
fake one)."""
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.gpu

SCRIPT = r"""
import sys
import numpy as np, torch
from native.build_testhooks import load
from unit.test_device_kernels import DTYPES, OPS, SCALES, inputs, half_reference
h = load()
from engine_native import gpu
h.device_kernels_set_candidates(*gpu.device_kernel_candidates())
torch.cuda.init()
torch.zeros(1, device="cuda")  # the primary context is current on this thread
h.device_kernels_ready()
stream = torch.cuda.current_stream().cuda_stream
def run(code, op, arrays, pre, post, dst_index=None):
    ts = [torch.from_numpy(a.view(np.uint8).copy()).cuda() for a in arrays]
    dst = ts[dst_index] if dst_index is not None else torch.empty_like(ts[0])
    h.device_reduce(code, op, [t.data_ptr() for t in ts], dst.data_ptr(), arrays[0].size,
                    pre, post, stream)
    torch.cuda.synchronize()
    return dst.cpu().numpy().tobytes()
bad = []
for code in sorted(DTYPES):
    for op in OPS:
        for nsrcs in (1, 2, 3, 4):
            for pre, post in SCALES:
                for count, dst_index in ((1001, None), (2 * 262144 + 3, nsrcs - 1)):
                    arrays = inputs(code, nsrcs, count, seed=code * 100 + op * 10 + nsrcs)
                    got = run(code, op, arrays, pre, post, dst_index)
                    ref = (half_reference(code, op, arrays, pre, post).tobytes()
                           if code in (5, 6) else
                           h.cpu_reduce(code, op, [a.tobytes() for a in arrays], pre, post))
                    if got != ref:
                        bad.append((code, op, nsrcs, pre, post, count))
print("BAD", bad[:20], len(bad))
"""


def test_device_reductions_on_the_gpu_match_the_cpu_path():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    tests_dir = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          timeout=900, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                              [tests_dir, os.path.dirname(tests_dir),
                               os.environ.get("PYTHONPATH", "")])})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.strip().endswith("BAD [] 0"), proc.stdout[-4000:]
