"""What every rank runs for ``TorchEstimator.fit``: read its Parquet share, train, checkpoint.

Runs inside a Spark barrier task (hvd_magic.spark.run); rank and size come from ``hvd.init()``.
The model and optimizer arrive pickled; the optimizer is rebuilt on this rank's copy of the
model from its class, its defaults and its state (as Horovod's estimator does), then wrapped in
``DistributedOptimizer``. Rank 0's parameters and optimizer state are broadcast first, so all
ranks start equal. Each epoch: every rank reads the same number of batches (Note [Shard plan]),
the validation loss is averaged over all validation rows read, and rank 0 writes a checkpoint
to the store. Rank 0 returns the history (the weights are read back from its checkpoint); the
others return None.
"""
from __future__ import annotations

import dataclasses
import time


@dataclasses.dataclass
class TrainSpec:
    model: object            # torch.nn.Module (pickled with the spec)
    optimizer_class: type
    optimizer_defaults: dict
    optimizer_state: dict
    loss: object             # callable(outputs, labels) -> scalar tensor
    feature_cols: list
    label_cols: list
    batch_size: int
    val_batch_size: int
    epochs: int
    seed: int
    shuffle: bool
    train_uri: str
    val_uri: str | None
    store: object            # hvd_magic.spark.store.Store
    run_id: str
    verbose: int
    input_shapes: list | None = None


def _inputs(batch, spec):
    """The model's inputs: float32, reshaped to ``input_shapes`` when given (Horovod's)."""
    inputs = [batch[c].float() for c in spec.feature_cols]
    if spec.input_shapes:
        inputs = [t.reshape(shape) for t, shape in zip(inputs, spec.input_shapes)]
    return inputs


def _labels(batch, cols):
    """Integer labels as int64 (what classification losses take), the rest as float32."""
    import torch
    return [batch[c].long() if not batch[c].is_floating_point() and batch[c].dtype != torch.bool
            else batch[c].float() for c in cols]


def _loss(spec, outputs, labels):
    """The loss of one batch: one output per label column, labels shaped like their output
    when only the trailing unit dimension differs ([B] vs [B, 1])."""
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    if len(outputs) != len(labels):
        raise ValueError(f"TorchEstimator: the model returned {len(outputs)} output(s) for "
                         f"{len(labels)} label column(s); return one output per label column")
    total = 0
    for out, lab in zip(outputs, labels):
        if lab.is_floating_point() and out.shape != lab.shape and out.numel() == lab.numel():
            lab = lab.reshape(out.shape)
        total = total + spec.loss(out, lab)
    return total


def _reader(spec, uri, batch_size, shuffle):
    from engine_native.data import ParquetShardReader
    return ParquetShardReader(uri, batch_size, list(dict.fromkeys(spec.feature_cols +
                                                                  spec.label_cols)),
                              shuffle=shuffle, seed=spec.seed)


def _validate(spec, model, reader, hvd, epoch):
    """The mean validation loss over every row read, on every rank."""
    import torch
    model.eval()
    total, rows = torch.zeros(1, dtype=torch.float64), torch.zeros(1, dtype=torch.float64)
    with torch.no_grad():
        reader.set_epoch(epoch)
        for batch in reader:
            n = len(batch[spec.label_cols[0]])
            loss = _loss(spec, model(*_inputs(batch, spec)),
                         _labels(batch, spec.label_cols))
            total += loss.item() * n
            rows += n
    sums = hvd.allreduce(torch.cat([total, rows]), op=hvd.Sum, name=f"hvd.estimator.val.{epoch}")
    return float(sums[0] / sums[1])


def train_on_rank(spec: TrainSpec):
    import torch

    import engine_native.torch as hvd
    hvd.init()
    torch.manual_seed(spec.seed)
    model = spec.model
    optimizer = spec.optimizer_class(model.parameters(), **spec.optimizer_defaults)
    if spec.optimizer_state.get("state"):
        optimizer.load_state_dict(spec.optimizer_state)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    train = _reader(spec, spec.train_uri, spec.batch_size, spec.shuffle)
    val = _reader(spec, spec.val_uri, spec.val_batch_size, False) if spec.val_uri else None
    history = {"train_loss": [], "val_loss": []} if val else {"train_loss": []}
    started = time.perf_counter()
    for epoch in range(spec.epochs):
        model.train()
        train.set_epoch(epoch)
        total, rows = 0.0, 0
        for batch in train:
            optimizer.zero_grad()
            loss = _loss(spec, model(*_inputs(batch, spec)),
                         _labels(batch, spec.label_cols))
            loss.backward()
            optimizer.step()
            n = len(batch[spec.label_cols[0]])
            total, rows = total + loss.item() * n, rows + n
        mean = hvd.allreduce(torch.tensor([total / max(rows, 1)]),
                             name=f"hvd.estimator.train.{epoch}")
        history["train_loss"].append(float(mean))
        if val:
            history["val_loss"].append(_validate(spec, model, val, hvd, epoch))
        if hvd.rank() == 0:
            spec.store.save_torch(spec.store.checkpoint_path(spec.run_id),
                                  {"epoch": epoch, "model": model.state_dict(),
                                   "optimizer": optimizer.state_dict(), "history": history})
            if spec.verbose:
                print(f"epoch {epoch + 1}/{spec.epochs}: " +
                      ", ".join(f"{k} {v[-1]:.4f}" for k, v in history.items()), flush=True)
    result = {"history": history, "train_seconds": time.perf_counter() - started} \
        if hvd.rank() == 0 else None
    hvd.shutdown()
    return result
