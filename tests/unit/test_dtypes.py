"""engine_native._dtypes: bfloat16 arrives with its first use, not at import (ml_dtypes alone
took ~0.9 s of every rank's start), and is then a supported dtype like any other."""
import subprocess
import sys
import textwrap

_SCRIPT = textwrap.dedent("""
    import sys
    import numpy as np
    import engine_native as hvd

    assert "ml_dtypes" not in sys.modules, "importing engine_native imported ml_dtypes"
    import ml_dtypes

    hvd.init()
    x = np.arange(5).astype(ml_dtypes.bfloat16)
    y = hvd.allreduce(x, op=hvd.Sum, name="bf16")   # the C fast path misses, then registers
    assert y.dtype == x.dtype and (y == x).all(), (y.dtype, y)
    z = hvd.allgather(np.ones((2, 3), ml_dtypes.bfloat16), name="bf16.gather")
    assert z.dtype == x.dtype and z.shape == (2, 3)
    from engine_native.numpy_ops import supported_dtypes
    assert "bfloat16" in supported_dtypes()
    try:
        hvd.allreduce(np.zeros(2, np.complex64), name="c64")
    except TypeError as exc:
        assert "unsupported dtype complex64" in str(exc) and "bfloat16" in str(exc), exc
    else:
        raise AssertionError("complex64 was accepted")
    hvd.shutdown()
    print("ok")
""")


def test_bfloat16_is_registered_by_its_first_use_not_by_the_import():
    out = subprocess.run([sys.executable, "-c", _SCRIPT], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stdout + out.stderr
