"""The CPU reduction kernels' two-source form (common::reduceFrom, dst = a op b in one pass: a
fold's first step in the shm allreduce and reduce-scatter) gives the bits of the in-place form
after a copy (dst = a; reduceInto(dst, b)) for every dtype and op, at lengths that end inside
and on the half types' 256-element blocks and the vector loops' widths, with NaNs of both
signs, infinities and signed zeros among the floats. Min/Max keep a NaN from whichever side it
is on, so swapped operands show there, bit for bit; a float Sum or Product of two NaNs is a
NaN whose sign the compiler may take from either operand (it may swap a commutative op's), in
either form alike: there only "NaN" is compared.
"""
import ml_dtypes
import numpy as np
import pytest

from native.build_testhooks import load

_hooks = load()
# common::DataType codes -> NumPy dtypes; common::ReduceOp codes
DTYPES = {0: np.uint8, 1: np.int8, 2: np.int16, 3: np.int32, 4: np.int64, 5: np.float16,
          6: ml_dtypes.bfloat16, 7: np.float32, 8: np.float64, 9: np.bool_}
FLOATS = (5, 6, 7, 8)
OPS = {"sum": 1, "min": 3, "max": 4, "product": 5}
LENGTHS = (0, 1, 7, 31, 255, 256, 257, 1001)
SPECIALS = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0])


def _operands(code, count, seed):
    rng = np.random.default_rng(seed)
    if code == 9:
        return [rng.integers(0, 3, count).astype(np.uint8) for _ in range(2)]  # 2: nonzero
    if code not in FLOATS:
        info = np.iinfo(DTYPES[code])
        return [rng.integers(info.min, info.max, count, dtype=DTYPES[code], endpoint=True)
                for _ in range(2)]
    pair = []
    for _ in range(2):
        x = (rng.integers(-64, 64, count) / 4).astype(np.float64)
        if count:
            at = rng.integers(0, count, max(1, count // 8))
            x[at] = rng.choice(SPECIALS, at.size)
        pair.append(x.astype(DTYPES[code]))
    return pair


@pytest.mark.parametrize("code", sorted(DTYPES), ids=lambda c: np.dtype(DTYPES[c]).name)
@pytest.mark.parametrize("op", OPS.values(), ids=OPS.keys())
def test_reduce_from_is_a_copy_then_an_in_place_reduce(code, op):
    for count in LENGTHS:
        a, b = _operands(code, count, seed=code * 1000 + op * 100 + count)
        got = _hooks.cpu_reduce_from(code, op, a.tobytes(), b.tobytes())
        want = _hooks.cpu_reduce(code, op, [a.tobytes(), b.tobytes()], 1.0, 1.0)
        if code in FLOATS and op in (OPS["sum"], OPS["product"]):
            got, want = (np.frombuffer(x, DTYPES[code]).astype(np.float64) for x in (got, want))
            nan = np.isnan(want)
            assert (np.isnan(got) == nan).all(), f"count={count}"
            got, want = got[~nan], want[~nan]
            assert got.tobytes() == want.tobytes(), f"count={count}"  # (signed zeros too)
        else:
            assert got == want, f"count={count}"


def test_operands_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="the same whole number of elements"):
        _hooks.cpu_reduce_from(7, 1, bytes(8), bytes(4))
