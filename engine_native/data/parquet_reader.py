"""``ParquetShardReader``: this rank's share of a Parquet dataset, as batches of tensors.

    import engine_native.torch as hvd
    from engine_native.data import ParquetShardReader
    hvd.init()
    reader = ParquetShardReader("/data/train.parquet", batch_size=64,
                                columns=["features", "label"], seed=42)
    for epoch in range(3):
        reader.set_epoch(epoch)                 # a new shuffle, the same on every rank
        for batch in reader:                    # {"features": Tensor[64, 32], "label": ...}
            ...

Rank and size come from ``hvd.init()`` (or pass ``rank=``/``size=``: Spark tasks, tests). Which
rows a rank reads is Note [Shard plan] (parquet_plan.py): every rank reads the same number of
rows, so every rank yields ``len(reader)`` batches of the same sizes. Row groups are read and
decoded by ``num_threads`` background threads (pyarrow releases the GIL while it decodes), up
to ``prefetch`` slices ahead, and consumed in plan order, so a run is deterministic. Rows are
shuffled within each slice, on top of the shuffled row-group order.
"""
from __future__ import annotations

import collections
from concurrent.futures import ThreadPoolExecutor
import threading

import numpy as np

from engine_native.data import parquet_columns as columns_mod
from engine_native.data.parquet_plan import Slice, rows_per_rank, shard_slices
from engine_native.data.parquet_source import ParquetSource


def _rank_and_size(rank, size):
    if rank is not None and size is not None:
        return int(rank), int(size)
    if rank is not None or size is not None:
        raise ValueError("pass both rank= and size=, or neither (then hvd.init() decides)")
    from engine_native import basics
    if not basics.is_initialized():
        raise ValueError("ParquetShardReader needs this process's rank: call hvd.init() "
                         "first, or pass rank= and size=")
    return basics.rank(), basics.size()


class ParquetShardReader:
    """Iterate this rank's batches of a Parquet dataset (see the module docstring).

    Parameters
    ----------
    path : str
        A Parquet file or directory, local or any URI ``pyarrow.fs`` opens.
    batch_size : int
        Rows per batch; the last batch of an epoch is smaller unless ``drop_last``.
    columns : list of str, optional
        Columns to read (default: all); each must be able to become a tensor.
    rank, size : int, optional
        This reader's rank and the number of readers (default: from ``hvd.init()``).
    shuffle : bool
        Shuffle row groups and rows, differently per epoch (``set_epoch``), alike on all ranks.
    seed : int
        The shuffle's seed; the same seed and epoch give the same batches.
    drop_last : bool
        Drop each epoch's last, smaller batch.
    filesystem : pyarrow.fs.FileSystem, optional
        Instead of resolving one from ``path``.
    num_threads, prefetch : int
        Background decoding threads, and how many row-group slices may be decoded ahead.
    as_tensors : bool
        Yield ``torch.Tensor`` (default) or NumPy arrays.
    """

    def __init__(self, path, batch_size, columns=None, *, rank=None, size=None, shuffle=True,
                 seed=0, drop_last=False, filesystem=None, num_threads=2, prefetch=4,
                 as_tensors=True):
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be at least 1, got {batch_size}")
        if int(num_threads) < 1 or int(prefetch) < 1:
            raise ValueError("num_threads and prefetch must be at least 1")
        self.rank, self.size = _rank_and_size(rank, size)
        if not 0 <= self.rank < self.size:
            raise ValueError(f"rank must be in [0, {self.size}), got {self.rank}")
        self.source = ParquetSource(path, filesystem)
        names = list(columns) if columns is not None else list(self.source.schema.names)
        if not names:
            raise ValueError("columns is empty: name at least one column to read")
        self.specs = [columns_mod.column_spec(self.source.schema, n) for n in names]
        self.batch_size, self.shuffle, self.seed = int(batch_size), bool(shuffle), int(seed)
        self.drop_last, self.as_tensors = bool(drop_last), bool(as_tensors)
        self.num_threads, self.prefetch = int(num_threads), int(prefetch)
        self.epoch = 0
        self.rows_per_epoch = rows_per_rank(self.source.row_groups, self.size)
        if self.rows_per_epoch == 0:
            raise ValueError(f"{path!r} has {self.source.num_rows} row(s), fewer than the "
                             f"{self.size} ranks reading it: every rank needs at least one row")
        self._local = threading.local()

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose shuffle the next iteration uses (call it on every rank)."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        """Batches per epoch: the same on every rank."""
        full, rest = divmod(self.rows_per_epoch, self.batch_size)
        return full if self.drop_last or rest == 0 else full + 1

    def slices(self) -> list[Slice]:
        """This rank's row-group slices for the current epoch, in reading order."""
        return shard_slices(self.source.row_groups, self.rank, self.size, self.epoch,
                            self.seed, self.shuffle)

    def __iter__(self):
        slices = self.slices()
        batches = _Batcher(self.batch_size, [s.name for s in self.specs])
        with ThreadPoolExecutor(self.num_threads, thread_name_prefix="hvd-parquet") as pool:
            pending = collections.deque()
            for i, piece in enumerate(slices):
                pending.append(pool.submit(self._read, piece, i))
                while len(pending) > self.prefetch:
                    yield from self._emit(batches.add(pending.popleft().result()))
            while pending:
                yield from self._emit(batches.add(pending.popleft().result()))
        if not self.drop_last:
            yield from self._emit(batches.flush())

    def _read(self, piece: Slice, position: int) -> dict:
        files = self._local.__dict__.setdefault("files", {})
        handle = files.get(piece.group.path) or files.setdefault(
            piece.group.path, self.source.open(piece.group.path))
        table = handle.read_row_group(piece.group.index, columns=[s.name for s in self.specs])
        table = table.slice(piece.start, piece.num_rows)
        arrays = {s.name: columns_mod.decode(table.column(s.name), s) for s in self.specs}
        if self.shuffle:
            order = np.random.default_rng([self.seed, self.epoch, self.rank, position])
            perm = order.permutation(piece.num_rows)
            arrays = {k: v[perm] for k, v in arrays.items()}
        return arrays

    def _emit(self, ready):
        for batch in ready:
            yield _to_tensors(batch) if self.as_tensors else batch


class _Batcher:
    """Cuts decoded slices into batches of exactly ``batch_size`` rows (the rest waits)."""

    def __init__(self, batch_size: int, names: list):
        self.batch_size, self.names = batch_size, names
        self.parts, self.rows = [], 0

    def add(self, arrays: dict) -> list:
        self.parts.append(arrays)
        self.rows += len(arrays[self.names[0]])
        out = []
        while self.rows >= self.batch_size:
            out.append(self._take(self.batch_size))
        return out

    def flush(self) -> list:
        return [self._take(self.rows)] if self.rows else []

    def _take(self, n: int) -> dict:
        merged = {k: np.concatenate([p[k] for p in self.parts]) for k in self.names} \
            if len(self.parts) > 1 else self.parts[0]
        batch = {k: v[:n] for k, v in merged.items()}
        rest = {k: v[n:] for k, v in merged.items()}
        self.rows -= n
        self.parts = [rest] if self.rows else []
        return batch


def _to_tensors(batch: dict) -> dict:
    import torch
    # Arrays that still share pyarrow's read-only buffers are copied: a tensor must be writable.
    return {k: torch.from_numpy(v if v.flags.writeable and v.flags.c_contiguous else v.copy())
            for k, v in batch.items()}
