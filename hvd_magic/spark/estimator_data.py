"""The estimator's data step on the driver: check the DataFrame, write it to the store once.

Everything here runs before any rank starts, so bad input fails fast and costs nothing.

Note [Dataset reuse]
  The key of a written dataset is a digest of the DataFrame's logical plan
  (``DataFrame.semanticHash()``), the columns written, the validation setting and the seed. A
  second ``fit`` on the same DataFrame finds ``data/<key>/train/_SUCCESS`` and reads the files
  already there. A source that changes behind the same plan (new files in a table the plan
  reads by name) is not detected: use another store or ``rewrite_data=True`` then. Data are
  written to a temporary directory and renamed into place when complete, so a failed or
  interrupted write never leaves a half dataset that a later fit would take as done.
  ``_SUCCESS`` in a split's directory is written last, after the move.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath

VALIDATION_COL = "__hvd_validation"
_NUMERIC = ("ByteType", "ShortType", "IntegerType", "LongType", "FloatType", "DoubleType",
            "BooleanType", "DecimalType")


@dataclasses.dataclass(frozen=True)
class WrittenData:
    train_uri: str
    val_uri: str | None
    reused: bool
    train_rows: int | None  # counted while writing; None when reused
    val_rows: int | None


def _kind(data_type) -> str | None:
    """'scalar', 'array', 'vector' or None (cannot become a tensor)."""
    name = type(data_type).__name__
    if name in _NUMERIC:
        return "scalar"
    if name == "ArrayType" and type(data_type.elementType).__name__ in _NUMERIC:
        return "array"
    if name == "VectorUDT":
        return "vector"
    return None


def check_columns(df, feature_cols, label_cols, validation) -> dict:
    """Each named column's kind; ValueError for a missing or non-numeric column."""
    fields = {f.name: f.dataType for f in df.schema.fields}
    kinds = {}
    for role, names in (("feature", feature_cols), ("label", label_cols)):
        if not names:
            raise ValueError(f"TorchEstimator: {role}_cols is empty; name the DataFrame's "
                             f"{role} column(s)")
        for name in names:
            if name not in fields:
                raise ValueError(f"TorchEstimator: {role} column {name!r} is not in the "
                                 f"DataFrame; its columns are {', '.join(fields)}")
            kind = _kind(fields[name])
            if kind is None:
                raise ValueError(f"TorchEstimator: {role} column {name!r} has type "
                                 f"{fields[name].simpleString()}, which cannot become a tensor: "
                                 f"use numeric columns, arrays of numbers or ML vectors")
            kinds[name] = kind
    if isinstance(validation, str):
        if validation not in fields or type(fields[validation]).__name__ != "BooleanType" \
                and _kind(fields[validation]) != "scalar":
            raise ValueError(f"TorchEstimator: validation column {validation!r} must be a "
                             f"boolean or 0/1 column of the DataFrame")
    elif validation is not None and not 0.0 <= float(validation) < 1.0:
        raise ValueError(f"TorchEstimator: validation must be a fraction in [0, 1) or a column "
                         f"name, got {validation!r}")
    return kinds


def dataset_key(df, columns, validation, seed) -> str:
    digest = hashlib.sha256(json.dumps(
        [df.semanticHash(), list(columns), validation, seed]).encode())
    return digest.hexdigest()[:20]


def _prepared(df, feature_cols, label_cols, kinds, validation, seed):
    """Only the needed columns, ML vectors as arrays, decimals as doubles, the split marked."""
    from pyspark.ml.functions import vector_to_array
    from pyspark.sql import functions as F
    cols = []
    for name in dict.fromkeys(list(feature_cols) + list(label_cols)):
        col = F.col(name)
        if kinds[name] == "vector":
            col = vector_to_array(col, "float32")
        elif type(df.schema[name].dataType).__name__ == "DecimalType":
            col = col.cast("double")
        cols.append(col.alias(name))
    if isinstance(validation, str):
        cols.append(F.col(validation).cast("boolean").alias(VALIDATION_COL))
    elif validation:
        cols.append((F.rand(seed) < float(validation)).alias(VALIDATION_COL))
    return df.select(*cols)


def write_once(df, store, feature_cols, label_cols, kinds, validation, seed, min_rows: int,
               rewrite: bool = False) -> WrittenData:
    """Write train (and val) Parquet under the store unless already there (Note [Dataset
    reuse]); each split needs ``min_rows`` rows (one per rank), else ValueError, nothing written."""
    key = dataset_key(df, list(feature_cols) + list(label_cols), validation, seed)
    train, val = store.data_path(key, "train"), store.data_path(key, "val")
    has_val = bool(validation)
    done = store.exists(train + "/_SUCCESS") and (not has_val or store.exists(val + "/_SUCCESS"))
    if done and not rewrite:
        return WrittenData(store.uri(train), store.uri(val) if has_val else None, True, None,
                           None)
    # One pass over the DataFrame: both splits in one write (partitioned by the split
    # marker) to a temporary directory; counted from the Parquet footers; moved into place
    # only when both splits have enough rows (else the temporary directory goes, nothing else).
    prepared = _prepared(df, feature_cols, label_cols, kinds, validation, seed)
    tmp = store.temporary_sibling(posixpath.dirname(train))
    if has_val:
        prepared.write.partitionBy(VALIDATION_COL).parquet(store.uri(tmp))
        written = {train: f"{tmp}/{VALIDATION_COL}=false", val: f"{tmp}/{VALIDATION_COL}=true"}
    else:
        prepared.write.parquet(store.uri(tmp))
        written = {train: tmp}
    try:
        rows = [_rows(store, path) for path in written.values()]
        if rows[0] < min_rows:
            raise ValueError(f"TorchEstimator: {rows[0]} training row(s)" +
                             (" after the validation split" if has_val else "") +
                             f", fewer than the {min_rows} ranks: nothing to train on")
        if has_val and rows[1] < min_rows:
            raise ValueError(f"TorchEstimator: the validation split has {rows[1]} row(s), "
                             f"fewer than the {min_rows} ranks: use a larger validation "
                             f"fraction or none")
        for final, source in written.items():
            if store.exists(final):  # rewrite: the old copy goes only once the new one is whole
                store.filesystem.delete_dir(final)
            store.move_into_place(source, final)
            store.write_bytes(f"{final}/_SUCCESS", b"")
    finally:
        if store.exists(tmp):
            store.filesystem.delete_dir(tmp)
    return WrittenData(store.uri(train), store.uri(val) if has_val else None, False, rows[0],
                       rows[1] if has_val else None)


def _rows(store, path: str) -> int:
    """Rows of the Parquet files under ``path`` (0 when Spark wrote none there)."""
    from engine_native.data.parquet_source import ParquetSource
    if not store.exists(path):
        return 0
    try:
        return ParquetSource(path, store.filesystem).num_rows
    except ValueError:  # a directory without Parquet files
        return 0
