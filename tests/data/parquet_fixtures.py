"""Small Parquet datasets whose every row says which row it is (``id``), for the reader's tests."""
from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def rows_table(n: int, width: int = 3) -> pa.Table:
    """Row i: id = i, x = [i*width, ..., i*width + width-1] (float32 list), y = i % 7 (int8)."""
    ids = np.arange(n, dtype=np.int64)
    x = np.arange(n * width, dtype=np.float32).reshape(n, width)
    return pa.table({"id": ids,
                     "x": pa.FixedSizeListArray.from_arrays(pa.array(x.ravel()), width),
                     "y": pa.array((ids % 7).astype(np.int8))})


def write_dataset(directory: str, n: int, files: int = 3, row_group_size: int = 37) -> str:
    """``n`` rows over ``files`` files of uneven lengths and row groups; Spark's side files too."""
    os.makedirs(directory, exist_ok=True)
    table = rows_table(n)
    cuts = np.linspace(0, n, files + 1).astype(int)
    for i in range(files):
        part = table.slice(cuts[i], cuts[i + 1] - cuts[i])
        pq.write_table(part, os.path.join(directory, f"part-{i:05d}.parquet"),
                       row_group_size=row_group_size + 11 * i)
    open(os.path.join(directory, "_SUCCESS"), "w").close()
    return directory
