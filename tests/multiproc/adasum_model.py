"""A NumPy model of Adasum's vector-halving, distance-doubling tree (Horovod's
``AdasumMPI::FusedAllreduce``; ours is algo/allreduce_adasum.cc), for the multi-process tests.

It simulates every rank: the halving splits (the lower rank keeps the first floor(len/2)
elements), each rank's per-tensor partial sums over its piece (float32/float64 left to right in
double; half types in Horovod's AVX kernel's four lanes), their sum over the level's 2d ranks by
recursive doubling, the coefficients ``1 - dot / |x|^2 * 0.5`` (1 below sqrt(DBL_MIN)) and the
update ``alpha a + beta b`` in the tensor's own arithmetic: float32/float64 in double, rounded
once; half types in float32 with the coefficients rounded to float32, ``fma(beta, b, alpha a)``
rounded once to float32 and then to the half type. Every floating-point operation is the one
the core performs, in the same order, so the model is compared bit for bit.
"""
from __future__ import annotations

import math
import sys

import numpy as np

from multiproc.checks import LOW_PRECISION, horovod_scale

_MIN_NORM2 = math.sqrt(sys.float_info.min)


def coefficient(dot: float, norm2: float) -> float:
    return 1.0 - dot / norm2 * 0.5 if norm2 >= _MIN_NORM2 else 1.0


def _seq_sum(x: np.ndarray) -> float:
    """Left-to-right double sum (np.sum would add pairwise)."""
    return float(np.cumsum(x, dtype=np.float64)[-1]) if x.size else 0.0


def _lane_sum(x: np.ndarray) -> float:
    lanes = [_seq_sum(x[k::4]) for k in range(4)]
    return (lanes[0] + lanes[2]) + (lanes[1] + lanes[3])


def dot_and_norms(own: np.ndarray, other: np.ndarray):
    a = own.astype(np.float64)
    b = other.astype(np.float64)
    total = _lane_sum if own.dtype in LOW_PRECISION else _seq_sum
    return total(a * b), total(a * a), total(b * b)


def _fma_to_float32(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """float32(p + q) rounded once, for exact doubles p and q (fmaf's single rounding): the
    double sum is nudged off a float32 midpoint toward the lost error before rounding."""
    s = p + q
    err = (p - (s - (s - p))) + (q - (s - p))  # two-sum: s + err == p + q exactly
    near = s.astype(np.float32)
    above = near.astype(np.float64) > s
    lower = np.where(above, np.nextafter(near, np.float32(-np.inf)), near).astype(np.float64)
    upper = np.where(above, near, np.nextafter(near, np.float32(np.inf))).astype(np.float64)
    midpoint = (err != 0) & (s == (lower + upper) / 2)
    s = np.where(midpoint, np.nextafter(s, s + err), s)
    return s.astype(np.float32)


def scaled_add(own: np.ndarray, a_coeff: float, other: np.ndarray, b_coeff: float):
    if own.dtype in LOW_PRECISION:
        ca, cb = np.float32(a_coeff), np.float32(b_coeff)
        first = (ca * own.astype(np.float32)).astype(np.float64)  # a float32 product
        second = np.float64(cb) * other.astype(np.float64)  # exact: 24 x 11 bits
        return _fma_to_float32(second, first).astype(own.dtype)
    wide = np.float64(a_coeff) * own.astype(np.float64) + np.float64(b_coeff) * other.astype(
        np.float64)
    return wide.astype(own.dtype)


def _group_sum(partials: list, level: int) -> list:
    """Recursive doubling over ranks sharing r >> (level + 1): step i adds the partner r ^ 2^i."""
    sums = [p.copy() for p in partials]
    for i in range(level + 1):
        sums = [sums[r] + sums[r ^ (1 << i)] for r in range(len(sums))]
    return sums


def vhdd(buffers: list, counts, extra_sum=None) -> list:
    """Each rank's result of Adasum over ``buffers`` (one 1-D array per rank, tensors of
    ``counts`` elements back to back). ``extra_sum(level, sums) -> sums`` adds the partial sums
    of ranks outside the tree (the hierarchical form's host members) after each group sum."""
    n = len(buffers)
    assert n & (n - 1) == 0
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    bufs = [b.copy() for b in buffers]
    ranges = [(0, bufs[0].size)] * n
    level, d = 0, 1
    while d < n:
        sent = [b.copy() for b in bufs]
        keep = []
        for r in range(n):
            lo, hi = ranges[r]
            mid = lo + (hi - lo) // 2
            keep.append((lo, mid) if (r & d) == 0 else (mid, hi))
        partials = []
        for r in range(n):
            lo, hi = keep[r]
            lower = (r & d) == 0
            p = np.zeros((len(counts), 3))
            for t in range(len(counts)):
                b, e = max(lo, offsets[t]), min(hi, offsets[t + 1])
                if b < e:
                    dot, own, other = dot_and_norms(bufs[r][b:e], sent[r ^ d][b:e])
                    p[t] = (dot, own, other) if lower else (dot, other, own)
            partials.append(p)
        sums = _group_sum(partials, level)
        if extra_sum is not None:
            sums = extra_sum(level, sums)
        for r in range(n):
            lo, hi = keep[r]
            lower = (r & d) == 0
            for t in range(len(counts)):
                b, e = max(lo, offsets[t]), min(hi, offsets[t + 1])
                if b >= e:
                    continue
                dot, na, nb = sums[r][t]
                ca, cb = coefficient(dot, na), coefficient(dot, nb)
                bufs[r][b:e] = scaled_add(bufs[r][b:e], ca if lower else cb, sent[r ^ d][b:e],
                                          cb if lower else ca)
        ranges = keep
        level, d = level + 1, d << 1
    out = np.empty_like(bufs[0])
    for r in range(n):
        lo, hi = ranges[r]
        out[lo:hi] = bufs[r][lo:hi]
    return out


def adasum(inputs: list, counts=None) -> np.ndarray:
    """Adasum of one tensor per rank (or of fused batches: ``counts`` per tensor)."""
    flat = [np.ascontiguousarray(x).reshape(-1) for x in inputs]
    counts = [flat[0].size] if counts is None else list(counts)
    if len(flat) == 1:
        return flat[0].copy()
    return vhdd(flat, counts)


def pairwise(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a (+) b in float64, the definition the properties are stated for."""
    a = a.astype(np.float64).reshape(-1)
    b = b.astype(np.float64).reshape(-1)
    dot = float(a @ b)
    return coefficient(dot, float(a @ a)) * a + coefficient(dot, float(b @ b)) * b


def hierarchical_two_hosts(inputs: list, counts) -> np.ndarray:
    """The hierarchical form for hosts {0, 1} and {2, 3} (algo/allreduce_adasum.cc): host sums
    (exact for the tests' k/8 inputs), local rank l's block (evenBlocks) combined across the
    two hosts with the per-tensor sums added over the cross pair and then over the host, the
    blocks gathered, and the result scaled by 1 / 2 (the host size)."""
    flat = [np.ascontiguousarray(x).reshape(-1) for x in inputs]
    dtype = flat[0].dtype
    host = [(flat[2 * h].astype(np.float64) + flat[2 * h + 1]).astype(dtype) for h in (0, 1)]
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    size = host[0].size
    blocks = [0, size - size // 2, size]  # evenBlocks(size, 2): the first block takes the extra
    pieces, cross = {}, []
    for l in (0, 1):
        lo, hi = blocks[l], blocks[l + 1]
        mid = lo + (hi - lo) // 2
        parts = []
        for h in (0, 1):
            pieces[l, h] = (lo, mid) if h == 0 else (mid, hi)
            p = np.zeros((len(counts), 3))
            for t in range(len(counts)):
                b, e = max(pieces[l, h][0], offsets[t]), min(pieces[l, h][1], offsets[t + 1])
                if b < e:
                    dot, own, other = dot_and_norms(host[h][b:e], host[1 - h][b:e])
                    p[t] = (dot, own, other) if h == 0 else (dot, other, own)
            parts.append(p)
        cross.append(parts[0] + parts[1])
    sums = cross[0] + cross[1]
    out = np.empty_like(host[0])
    for (l, h), (lo, hi) in pieces.items():
        for t in range(len(counts)):
            b, e = max(lo, offsets[t]), min(hi, offsets[t + 1])
            if b < e:
                dot, na, nb = sums[t]
                ca, cb = coefficient(dot, na), coefficient(dot, nb)
                out[b:e] = scaled_add(host[h][b:e], ca if h == 0 else cb, host[1 - h][b:e],
                                      cb if h == 0 else ca)
    return horovod_scale(out, 0.5)
