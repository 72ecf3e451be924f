"""ParquetShardReader in one process: each rank's share played by a reader with rank=/size=."""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from data.parquet_fixtures import rows_table, write_dataset
from engine_native.data import ParquetShardReader


def epoch_ids(path, size, epoch, batch_size=16, **kw):
    """Per rank: the ids of every batch of ``epoch``, and the batch sizes."""
    out = []
    for rank in range(size):
        reader = ParquetShardReader(path, batch_size, ["id", "x", "y"], rank=rank, size=size,
                                    **kw)
        reader.set_epoch(epoch)
        batches = list(reader)
        assert len(batches) == len(reader)
        for b in batches:  # every row's columns stay together
            np.testing.assert_array_equal(b["x"][:, 0].numpy(), b["id"].numpy() * 3)
            np.testing.assert_array_equal(b["y"].numpy(), b["id"].numpy() % 7)
        out.append(([b["id"].tolist() for b in batches], [len(b["id"]) for b in batches]))
    return out


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("n", [300, 301, 999])
def test_every_row_once_and_equal_steps(tmp_path, size, n):
    path = write_dataset(str(tmp_path / "ds"), n)
    per_rank = epoch_ids(path, size, epoch=0)
    sizes = [s for _, s in per_rank]
    assert all(s == sizes[0] for s in sizes), f"batch sizes differ across ranks: {sizes}"
    ids = [i for batches, _ in per_rank for b in batches for i in b]
    assert len(ids) == len(set(ids)), "a row was read twice in one epoch"
    assert len(ids) == (n // size) * size  # n % size rows sit the epoch out (Note [Shard plan])
    assert set(ids) <= set(range(n))


def test_reshuffle_is_deterministic_and_differs_per_epoch(tmp_path):
    path = write_dataset(str(tmp_path / "ds"), 500)
    first = epoch_ids(path, 2, epoch=3, seed=7)
    assert epoch_ids(path, 2, epoch=3, seed=7) == first
    assert epoch_ids(path, 2, epoch=4, seed=7) != first
    assert epoch_ids(path, 2, epoch=3, seed=8) != first
    # without shuffling, ranks read contiguous rows in file order
    plain = epoch_ids(path, 2, epoch=3, shuffle=False)
    assert [i for b in plain[0][0] for i in b] == list(range(250))


def test_drop_last_and_batch_contents(tmp_path):
    path = write_dataset(str(tmp_path / "ds"), 100)
    reader = ParquetShardReader(path, 16, ["x", "y"], rank=0, size=2, drop_last=True)
    batches = list(reader)
    assert len(reader) == len(batches) == 3  # 50 rows: 3 full batches, the rest dropped
    assert batches[0]["x"].dtype == torch.float32 and batches[0]["x"].shape == (16, 3)
    assert batches[0]["y"].dtype == torch.int8
    plain = ParquetShardReader(path, 16, ["x"], rank=0, size=2, as_tensors=False)
    assert [len(b["x"]) for b in plain] == [16, 16, 16, 2]
    assert isinstance(next(iter(plain))["x"], np.ndarray)


def test_ndarray_cells_as_petastorm_writes_them(tmp_path):
    import io

    def npy(a):
        buf = io.BytesIO()
        np.save(buf, a)
        return buf.getvalue()

    def npz(a):
        buf = io.BytesIO()
        np.savez_compressed(buf, arr=a)
        return buf.getvalue()

    images = [np.full((2, 3), i, dtype=np.float64) for i in range(10)]
    table = pa.table({"img": pa.array([npy(a) for a in images], pa.binary()),
                      "zimg": pa.array([npz(a) for a in images], pa.binary())})
    pq.write_table(table, str(tmp_path / "p.parquet"))
    batch = next(iter(ParquetShardReader(str(tmp_path / "p.parquet"), 10, rank=0, size=1,
                                         shuffle=False)))
    assert batch["img"].shape == (10, 2, 3)
    np.testing.assert_array_equal(batch["img"].numpy(), np.stack(images))
    np.testing.assert_array_equal(batch["zimg"].numpy(), np.stack(images))


@pytest.mark.parametrize("columns, match", [
    (["id", "missing"], r"column 'missing' is not in the dataset; its columns are id, x, y"),
    (["name"], r"column 'name' has type string, which cannot become a tensor"),
    ([], r"columns is empty"),
])
def test_bad_columns_fail_before_reading(tmp_path, columns, match):
    table = rows_table(10).append_column("name", pa.array([str(i) for i in range(10)]))
    pq.write_table(table, str(tmp_path / "t.parquet"))
    with pytest.raises(ValueError, match=match):
        ParquetShardReader(str(tmp_path / "t.parquet"), 4, columns, rank=0, size=1)


def test_bad_data_and_arguments(tmp_path):
    ragged = pa.table({"v": pa.array([[1.0], [1.0, 2.0]], pa.list_(pa.float32()))})
    pq.write_table(ragged, str(tmp_path / "ragged.parquet"))
    with pytest.raises(ValueError, match=r"column 'v' holds lists of different lengths"):
        list(ParquetShardReader(str(tmp_path / "ragged.parquet"), 2, rank=0, size=1))
    nulls = pa.table({"v": pa.array([1.0, None, 3.0])})
    pq.write_table(nulls, str(tmp_path / "nulls.parquet"))
    with pytest.raises(ValueError, match=r"column 'v' has 1 null value"):
        list(ParquetShardReader(str(tmp_path / "nulls.parquet"), 2, rank=0, size=1))
    with pytest.raises(FileNotFoundError, match="no Parquet dataset"):
        ParquetShardReader(str(tmp_path / "absent"), 2, rank=0, size=1)
    path = write_dataset(str(tmp_path / "ds"), 3, files=1)
    with pytest.raises(ValueError, match=r"fewer than the 4 ranks"):
        ParquetShardReader(path, 2, rank=0, size=4)
    with pytest.raises(ValueError, match=r"batch_size must be at least 1"):
        ParquetShardReader(path, 0, rank=0, size=1)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\)"):
        ParquetShardReader(path, 1, rank=2, size=2)
    with pytest.raises(ValueError, match=r"call hvd.init\(\) first, or pass rank= and size="):
        ParquetShardReader(path, 1)


def test_uri_and_filesystem(tmp_path):
    import pyarrow.fs as pafs
    path = write_dataset(str(tmp_path / "ds"), 40, files=2)
    by_uri = ParquetShardReader("file://" + path, 8, ["id"], rank=0, size=1, shuffle=False)
    by_fs = ParquetShardReader(path, 8, ["id"], rank=0, size=1, shuffle=False,
                               filesystem=pafs.LocalFileSystem())
    ids = [b["id"].tolist() for b in by_uri]
    assert ids == [b["id"].tolist() for b in by_fs]
    assert [i for b in ids for i in b] == list(range(40))
