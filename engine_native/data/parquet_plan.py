"""Which rows of a Parquet dataset each rank reads in an epoch — planned from metadata alone.

Note [Shard plan]
  A. The dataset's row groups are listed once, in file-path order (``list_row_groups``).
  B. Each epoch, the row groups are put in an order every rank derives alike: a permutation
     drawn from ``(seed, epoch)`` when shuffling, the file order otherwise. No communication:
     ranks agree because they compute the same thing from the same metadata.
  C. That order is one virtual sequence of N rows. Rank r of n reads rows
     ``[r * q, (r + 1) * q)`` of it, ``q = N // n``: every rank reads exactly q rows, so every
     rank has the same number of batches and no rank waits in a collective for one that ran
     out of data (Horovod's estimators get the same from ``steps_per_epoch``). The last
     ``N % n`` rows of the sequence are not read that epoch; with shuffling they are other rows
     each epoch. Ranges are contiguous, so a rank reads whole row groups except at most one
     partial group at each end.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class RowGroup:
    """One row group of one Parquet file."""

    path: str
    index: int
    num_rows: int


@dataclasses.dataclass(frozen=True)
class Slice:
    """Rows ``[start, stop)`` of a row group (positions within the group)."""

    group: RowGroup
    start: int
    stop: int

    @property
    def num_rows(self) -> int:
        return self.stop - self.start


def epoch_order(groups: list[RowGroup], epoch: int, seed: int, shuffle: bool) -> list[RowGroup]:
    """The row groups in the order of ``epoch`` (Note [Shard plan] B)."""
    if not shuffle:
        return list(groups)
    rng = np.random.default_rng([seed, epoch])
    return [groups[i] for i in rng.permutation(len(groups))]


def rows_per_rank(groups: list[RowGroup], size: int) -> int:
    """q of Note [Shard plan] C: rows every rank reads per epoch."""
    return sum(g.num_rows for g in groups) // size


def shard_slices(groups: list[RowGroup], rank: int, size: int, epoch: int, seed: int,
                 shuffle: bool) -> list[Slice]:
    """Rank ``rank``'s slices for ``epoch``, in reading order (Note [Shard plan] C)."""
    if not 0 <= rank < size:
        raise ValueError(f"rank must be in [0, {size}), got {rank}")
    quota = rows_per_rank(groups, size)
    begin, end = rank * quota, (rank + 1) * quota
    slices, offset = [], 0
    for group in epoch_order(groups, epoch, seed, shuffle):
        lo, hi = max(begin, offset), min(end, offset + group.num_rows)
        if lo < hi:
            slices.append(Slice(group, lo - offset, hi - offset))
        offset += group.num_rows
        if offset >= end:
            break
    return slices
