"""``Store``: where a Spark estimator keeps its Parquet data and its checkpoints.

    store = Store.create("/tmp/hvd-store")            # or "hdfs://...", "s3://bucket/prefix"

Layout under the prefix (Horovod's Store keeps the same kinds of things):
  data/<key>/train, data/<key>/val   the DataFrame as Parquet, written once per key (Note
                                     [Dataset reuse] in estimator_data.py)
  runs/<run_id>/checkpoint.pt        the model and optimizer after each epoch
Everything is written under a temporary name and renamed into place when complete, and
nothing already there is deleted or overwritten except a run's own checkpoint.
"""
from __future__ import annotations

import io
import posixpath
import uuid

import pyarrow as pa
import pyarrow.fs as pafs


class Store:
    """A prefix on a ``pyarrow.fs`` filesystem (local path or URI)."""

    def __init__(self, prefix: str, filesystem: pafs.FileSystem | None = None):
        if not prefix:
            raise ValueError("Store needs a prefix path, e.g. Store.create('/tmp/hvd-store')")
        if filesystem is None:
            try:
                filesystem, path = pafs.FileSystem.from_uri(prefix)
            except (pa.ArrowInvalid, TypeError):
                filesystem, path = pafs.LocalFileSystem(), prefix
        else:
            path = prefix
        self.prefix, self.filesystem, self.path = prefix, filesystem, path.rstrip("/")

    @classmethod
    def create(cls, prefix: str) -> "Store":
        """Horovod's ``Store.create(prefix_path)``: the store for a local path or URI."""
        return cls(prefix)

    def __repr__(self) -> str:
        return f"Store({self.prefix!r})"

    # Paths (in the filesystem's own form; ``uri`` turns one into what readers open)
    def data_path(self, key: str, split: str) -> str:
        return posixpath.join(self.path, "data", key, split)

    def checkpoint_path(self, run_id: str) -> str:
        return posixpath.join(self.path, "runs", run_id, "checkpoint.pt")

    def uri(self, path: str) -> str:
        """A URI for ``path`` that Spark and pyarrow both open."""
        if isinstance(self.filesystem, pafs.LocalFileSystem):
            return "file://" + path
        return f"{self.filesystem.type_name}://{path.lstrip('/')}"

    def exists(self, path: str) -> bool:
        return self.filesystem.get_file_info(path).type != pafs.FileType.NotFound

    def check_writable(self) -> None:
        """Write and remove a probe file; a clear error when the store cannot be written."""
        probe = posixpath.join(self.path, f".hvd-write-probe-{uuid.uuid4().hex}")
        try:
            self.filesystem.create_dir(self.path, recursive=True)
            with self.filesystem.open_output_stream(probe) as out:
                out.write(b"ok")
            self.filesystem.delete_file(probe)
        except (OSError, pa.ArrowException) as exc:
            raise PermissionError(f"the store {self.prefix!r} cannot be written ({exc}): pass "
                                  f"store=Store.create(<a writable path or URI>)") from exc

    def temporary_sibling(self, path: str) -> str:
        parent, name = posixpath.split(path)
        return posixpath.join(parent, f".{name}.tmp-{uuid.uuid4().hex[:12]}")

    def move_into_place(self, tmp: str, path: str) -> None:
        self.filesystem.create_dir(posixpath.dirname(path), recursive=True)
        self.filesystem.move(tmp, path)

    def write_bytes(self, path: str, data: bytes) -> None:
        """Write ``path`` whole: a reader never sees a partial file."""
        tmp = self.temporary_sibling(path)
        self.filesystem.create_dir(posixpath.dirname(path), recursive=True)
        with self.filesystem.open_output_stream(tmp) as out:
            out.write(data)
        self.filesystem.move(tmp, path)

    def read_bytes(self, path: str) -> bytes:
        with self.filesystem.open_input_stream(path) as src:
            return src.read()

    def save_torch(self, path: str, obj) -> None:
        import torch
        buf = io.BytesIO()
        torch.save(obj, buf)
        self.write_bytes(path, buf.getvalue())

    def load_torch(self, path: str):
        import torch
        return torch.load(io.BytesIO(self.read_bytes(path)), weights_only=False)
