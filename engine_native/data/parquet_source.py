"""Where a Parquet dataset lives: its filesystem, its files, their row groups and schema.

``path`` is a local path or a URI that ``pyarrow.fs`` opens (``file://``, ``s3://``,
``hdfs://``, ``gs://``); a ``pyarrow.fs.FileSystem`` may be passed instead of resolving one.
A directory is read as every Parquet file under it, in path order, skipping the files Spark
and Petastorm write beside the data (``_SUCCESS``, ``_common_metadata``: names starting with
``_`` or ``.``).
"""
from __future__ import annotations

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from engine_native.data.parquet_plan import RowGroup


class ParquetSource:
    """A dataset's files and row groups, listed once from their footers."""

    def __init__(self, path: str, filesystem: pafs.FileSystem | None = None):
        if filesystem is None:
            try:
                filesystem, path = pafs.FileSystem.from_uri(path)
            except (pa.ArrowInvalid, TypeError):
                filesystem = pafs.LocalFileSystem()
        self.filesystem, self.path = filesystem, path
        info = filesystem.get_file_info(path)
        if info.type == pafs.FileType.NotFound:
            raise FileNotFoundError(f"no Parquet dataset at {path!r}")
        try:
            dataset = ds.dataset(path, filesystem=filesystem, format="parquet")
        except (pa.ArrowInvalid, OSError) as exc:
            raise ValueError(f"{path!r} is not a readable Parquet dataset: {exc}") from exc
        self.files = sorted(dataset.files)
        if not self.files:
            raise ValueError(f"{path!r} holds no Parquet files")
        self.schema = dataset.schema
        self.row_groups = self._list_row_groups()

    def _list_row_groups(self) -> list[RowGroup]:
        groups = []
        for path in self.files:
            meta = self.open(path).metadata
            groups += [RowGroup(path, i, meta.row_group(i).num_rows)
                       for i in range(meta.num_row_groups) if meta.row_group(i).num_rows]
        return groups

    @property
    def num_rows(self) -> int:
        return sum(g.num_rows for g in self.row_groups)

    def open(self, path: str) -> pq.ParquetFile:
        return pq.ParquetFile(self.filesystem.open_input_file(path))
