"""Data for training on every rank: this rank's share of a Parquet dataset as tensors.

``ParquetShardReader`` needs ``pyarrow`` (``pip install "hvd-magic[data]"``).
"""
try:
    from engine_native.data.parquet_reader import ParquetShardReader
except ImportError as exc:  # pragma: no cover - depends on the environment
    if exc.name is None or not exc.name.startswith("pyarrow"):
        raise
    raise ImportError("engine_native.data needs pyarrow: pip install pyarrow "
                      "(or the hvd-magic[data] extra)") from exc

__all__ = ["ParquetShardReader"]
