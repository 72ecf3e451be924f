"""Parquet columns → NumPy arrays that become tensors: which columns can, and decoding them.

A column can become a tensor when it is numeric or boolean (one value per row → shape
``[rows]``), a list of numbers of one length in every row (→ ``[rows, length]``), or binary
cells holding NumPy arrays as Petastorm's ``NdarrayCodec``/``CompressedNdarrayCodec`` write
them (``np.save`` / ``np.savez_compressed`` bytes → ``[rows, *shape]``; decoded without
Petastorm itself). Anything else is refused when the reader is made, naming the column.
"""
from __future__ import annotations

import dataclasses
import io

import numpy as np
import pyarrow as pa

SCALAR, LIST, NDARRAY = "scalar", "list", "ndarray"
_NPY_MAGIC, _NPZ_MAGIC = b"\x93NUMPY", b"PK\x03\x04"


@dataclasses.dataclass(frozen=True)
class ColumnSpec:
    name: str
    kind: str  # SCALAR, LIST or NDARRAY


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def column_spec(schema: pa.Schema, name: str) -> ColumnSpec:
    """How column ``name`` decodes; ValueError naming it when it cannot become a tensor."""
    if name not in schema.names:
        raise ValueError(f"column {name!r} is not in the dataset; its columns are "
                         f"{', '.join(schema.names)}")
    t = schema.field(name).type
    if _numeric(t):
        return ColumnSpec(name, SCALAR)
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) \
            and _numeric(t.value_type):
        return ColumnSpec(name, LIST)
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return ColumnSpec(name, NDARRAY)
    raise ValueError(f"column {name!r} has type {t}, which cannot become a tensor: use numeric "
                     f"or boolean columns, lists of numbers, or Petastorm ndarray cells")


def decode(column: pa.ChunkedArray, spec: ColumnSpec) -> np.ndarray:
    """One column of a table slice as a NumPy array (first dimension = rows)."""
    if column.null_count:
        raise ValueError(f"column {spec.name!r} has {column.null_count} null value(s) in the "
                         f"rows read: fill or drop them before training")
    if spec.kind == SCALAR:
        return column.to_numpy()
    if spec.kind == LIST:
        return _decode_list(column.combine_chunks(), spec.name)
    return _decode_ndarrays(column, spec.name)


def _decode_list(array: pa.Array, name: str) -> np.ndarray:
    rows = len(array)
    if pa.types.is_fixed_size_list(array.type):
        width = array.type.list_size
        values = array.flatten()
    else:
        offsets = array.offsets.to_numpy()
        lengths = np.diff(offsets)
        width = int(lengths[0]) if rows else 0
        if rows and not np.all(lengths == width):
            raise ValueError(f"column {name!r} holds lists of different lengths "
                             f"({int(lengths.min())} to {int(lengths.max())}): a tensor needs "
                             f"one length; pad them when preparing the data")
        values = array.values.slice(int(offsets[0]) if rows else 0, rows * width)
    if values.null_count:
        raise ValueError(f"column {name!r} has null values inside its lists: fill them first")
    return values.to_numpy(zero_copy_only=False).reshape(rows, width)


def _load_cell(cell: bytes, name: str) -> np.ndarray:
    if cell.startswith(_NPY_MAGIC):
        return np.load(io.BytesIO(cell), allow_pickle=False)
    if cell.startswith(_NPZ_MAGIC):
        with np.load(io.BytesIO(cell), allow_pickle=False) as npz:
            return npz[npz.files[0]]
    raise ValueError(f"column {name!r} is binary but its cells are not NumPy arrays (neither "
                     f".npy nor .npz bytes, as Petastorm's ndarray codecs write): other "
                     f"encodings (images, pickles) cannot become tensors here")


def _decode_ndarrays(column: pa.ChunkedArray, name: str) -> np.ndarray:
    cells = [_load_cell(c, name) for c in column.to_pylist()]
    if not cells:
        return np.empty((0,), dtype=np.float32)
    shape = cells[0].shape
    for cell in cells:
        if cell.shape != shape:
            raise ValueError(f"column {name!r} holds arrays of different shapes ({shape} and "
                             f"{cell.shape}): a batch needs one shape")
    return np.stack(cells)
