"""Inputs and NumPy references of a random program's collectives (random_program.py).

Every rank can make every other rank's input (checks.make_input is a function of rank and
name), so each rank checks its own result of every collective it runs: exactly for integers
and bool, within checks.mismatch's tolerance for floats and integer averages.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from multiproc import checks

_DTYPES = {name: (checks.BFLOAT16 if name == "bfloat16" else np.dtype(name))
           for name in ("uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16",
                        "float32", "float64", "bool")}


def dtype_of(name: str) -> np.dtype:
    return _DTYPES[name]


def reduce_op(hvd, name: str) -> int:
    return {"sum": hvd.Sum, "avg": hvd.Average, "min": hvd.Min, "max": hvd.Max,
            "prod": hvd.Product}[name]


def make(step, salt: str, rank: int, tensor: int = 0, rows=None) -> np.ndarray:
    """Global rank ``rank``'s input ``tensor`` of ``step`` (rows ``(lo, hi)`` of it only)."""
    position = step.members.index(rank)
    return checks.make_input(dtype_of(step.dtypes[tensor]), step.shapes[position][tensor], rank,
                             f"{salt}.{tensor}", for_product=step.op == "prod", rows=rows)


def mismatch(hvd, step, salt: str, me: int, result, absent=()) -> Optional[str]:
    """None when ``result`` (what the API returned for ``step`` on global rank ``me``) is
    right, else what is wrong. ``absent``: members that joined without submitting (they
    contribute zeros to an allreduce)."""
    kind = step.kind
    if kind == "barrier":
        return None if result is None else f"barrier returned {result!r}"
    if kind in ("allreduce", "grouped_allreduce"):
        results = result if kind == "grouped_allreduce" else [result]
        if len(results) != len(step.dtypes):
            return f"{len(results)} results for {len(step.dtypes)} tensors"
        for t, got in enumerate(results):
            problem = _allreduce_mismatch(hvd, step, salt, t, got, absent)
            if problem:
                return f"tensor {t}: {problem}"
        return None
    dtype = dtype_of(step.dtypes[0])
    if kind == "allgather":
        expected = np.concatenate([make(step, salt, r) for r in step.members])
        return checks.mismatch(result, expected, dtype)
    if kind == "broadcast":
        return checks.mismatch(result, make(step, salt, step.root), dtype)
    if kind == "alltoall":
        return _alltoall_mismatch(step, salt, me, result)
    if kind == "reducescatter":
        k, position = len(step.members), step.members.index(me)
        base, extra = divmod(step.shapes[0][0][0], k)  # Horovod: the first dim0 % k get one more
        lo = position * base + min(position, extra)
        rows = (lo, lo + base + (1 if position < extra else 0))
        inputs = [make(step, salt, r, rows=rows) for r in step.members]
        op = reduce_op(hvd, step.op)
        return checks.mismatch(result, checks.reference(inputs, op), dtype, op)
    raise ValueError(f"unknown collective {kind!r}")


def _allreduce_mismatch(hvd, step, salt: str, tensor: int, got, absent) -> Optional[str]:
    dtype = dtype_of(step.dtypes[tensor])
    inputs = []
    for r in step.members:
        x = make(step, salt, r, tensor)
        inputs.append(np.zeros_like(x) if r in absent else x)
    op = reduce_op(hvd, step.op)
    flat = [x.reshape(-1) for x in inputs]  # checks.reference folds in place: no 0-d arrays
    expected = checks.reference(flat, op, *step.scales).reshape(inputs[0].shape)
    return checks.mismatch(got, expected, dtype, op)


def _alltoall_mismatch(step, salt: str, me: int, result) -> Optional[str]:
    out, received = result
    k, position = len(step.members), step.members.index(me)
    parts, counts = [], []
    for sender_position, r in enumerate(step.members):
        if step.splits is None:
            each = step.shapes[sender_position][0][0] // k
            row = [each] * k
        else:
            row = list(step.splits[sender_position])
        start = sum(row[:position])
        parts.append(make(step, salt, r, rows=(start, start + row[position])))
        counts.append(row[position])
    problem = checks.mismatch(out, np.concatenate(parts), dtype_of(step.dtypes[0]))
    if problem:
        return problem
    if list(np.asarray(received)) != counts:
        return f"received splits {list(received)}, expected {counts}"
    return None
