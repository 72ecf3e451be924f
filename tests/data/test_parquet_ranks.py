"""ParquetShardReader on real ranks: rank and size from hvd.init(), one collective per batch."""
import pytest

from data.parquet_fixtures import write_dataset
from multiproc.harness import run_ranks

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]


def read_epochs_suite(path, n_rows):
    """Every rank reads two epochs, allreducing once per batch (as a training step would): a
    rank with fewer batches would leave the others waiting. Rank 0 checks the union."""
    import engine_native.torch as hvd
    import torch

    from engine_native.data import ParquetShardReader
    hvd.init()
    reader = ParquetShardReader(path, batch_size=24, columns=["id", "x"], seed=5)
    per_epoch = []
    for epoch in range(2):
        reader.set_epoch(epoch)
        mine = []
        for step, batch in enumerate(reader):
            hvd.allreduce(torch.ones(1), name=f"step.{epoch}.{step}")
            mine.append(batch["id"])
        ids = hvd.allgather(torch.cat(mine), name=f"ids.{epoch}").tolist()
        steps = hvd.allgather(torch.tensor([len(mine)]), name=f"steps.{epoch}").tolist()
        per_epoch.append((ids, steps))
    hvd.shutdown()
    return per_epoch


@pytest.mark.parametrize("np_", [2, 3, 4])
def test_ranks_read_disjoint_shares_with_equal_steps(tmp_path, np_):
    n_rows = 997
    path = write_dataset(str(tmp_path / "ds"), n_rows)
    results = run_ranks(read_epochs_suite, np_, args=(path, n_rows), timeout=120)
    epochs = results[0].value
    for ids, steps in epochs:
        assert len(set(steps)) == 1, f"ranks ran different step counts: {steps}"
        assert len(ids) == len(set(ids)) == (n_rows // np_) * np_
        assert set(ids) <= set(range(n_rows))
    assert epochs[0][0] != epochs[1][0], "epoch 1 read the rows in epoch 0's order"
    assert all(r.value == epochs for r in results), "ranks saw different allgathers"
