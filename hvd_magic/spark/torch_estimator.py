"""``TorchEstimator``: fit a torch model on a Spark DataFrame with every rank reading Parquet.

    from hvd_magic.spark import Store, TorchEstimator
    est = TorchEstimator(model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1),
                         loss=torch.nn.functional.cross_entropy, feature_cols=["features"],
                         label_cols=["label"], batch_size=64, epochs=5, num_proc=2,
                         store=Store.create("/tmp/hvd-store"), validation=0.1)
    torch_model = est.fit(train_df)                 # a Spark Transformer
    scored = torch_model.transform(test_df)         # adds "label__output"

``fit``: (1) checks the columns, the arguments and that the store can be written — before
anything starts; (2) writes the DataFrame to the store as Parquet, once (Note [Dataset reuse]);
(3) trains on ``num_proc`` ranks in Spark barrier mode (hvd_magic.spark.run), each reading its
share with engine_native.data.ParquetShardReader (estimator_train.py), rank 0 checkpointing to
the store each epoch; (4) returns a ``TorchModel`` holding the trained weights. The parameter
names are Horovod's ``horovod.spark.torch.TorchEstimator``'s where they mean the same.
"""
from __future__ import annotations

import copy
import time
import uuid

from .estimator_data import check_columns, write_once
from .estimator_train import TrainSpec, train_on_rank


class TorchEstimator:
    """Train ``model`` on a DataFrame with ``num_proc`` ranks (see the module docstring).

    Parameters
    ----------
    model : torch.nn.Module; called as ``model(*features)``, one tensor per feature column
        (float32; ``[batch]`` for a scalar column, ``[batch, n]`` for arrays and ML vectors).
    optimizer : a torch optimizer built on ``model.parameters()``; rebuilt on each rank from
        its class, defaults and state.
    loss : callable ``loss(output, label)``; integer labels arrive as int64, others float32.
    feature_cols, label_cols : column names; one model output per label column.
    input_shapes : optional shape per feature column, e.g. ``[[-1, 1, 8, 8]]`` (Horovod's):
        each input is reshaped to it before the model is called, in fit and transform.
    batch_size, val_batch_size : rows per batch per rank (val default: batch_size).
    epochs : passes over the training data.
    num_proc : ranks (Spark barrier tasks); default Spark's default parallelism.
    store : hvd_magic.spark.Store (or a path/URI) for the data and checkpoints.
    validation : a fraction in [0, 1) split off at random, or a boolean column marking
        validation rows; None for none.
    shuffle : shuffle training rows each epoch (the same on every rank, per seed and epoch).
    random_seed : the seed of the split, the shuffle and torch's initial state.
    run_id : names the run's checkpoint in the store (default: a new id).
    rewrite_data : write the DataFrame again even if the store has it (Note [Dataset reuse]).
    verbose : 1 prints each epoch's losses from rank 0; 0 is quiet.
    """

    def __init__(self, *, model, optimizer, loss, feature_cols, label_cols, store,
                 batch_size=32, val_batch_size=None, epochs=1, num_proc=None, validation=None,
                 shuffle=True, random_seed=0, run_id=None, rewrite_data=False, verbose=1,
                 input_shapes=None):
        import torch
        from .store import Store
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"TorchEstimator: model must be a torch.nn.Module, got "
                            f"{type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise TypeError(f"TorchEstimator: optimizer must be a torch.optim.Optimizer built "
                            f"on model.parameters(), got {type(optimizer).__name__}")
        if not callable(loss):
            raise TypeError("TorchEstimator: loss must be callable as loss(output, label)")
        for name, value in (("batch_size", batch_size), ("epochs", epochs)):
            if int(value) < 1:
                raise ValueError(f"TorchEstimator: {name} must be at least 1, got {value}")
        if num_proc is not None and int(num_proc) < 1:
            raise ValueError(f"TorchEstimator: num_proc must be at least 1, got {num_proc}")
        self.model, self.optimizer, self.loss = model, optimizer, loss
        self.feature_cols, self.label_cols = list(feature_cols), list(label_cols)
        self.store = store if isinstance(store, Store) else Store.create(store)
        self.batch_size, self.epochs = int(batch_size), int(epochs)
        self.val_batch_size = int(val_batch_size or batch_size)
        self.num_proc, self.validation, self.shuffle = num_proc, validation, bool(shuffle)
        self.random_seed, self.run_id = int(random_seed), run_id
        self.rewrite_data, self.verbose = bool(rewrite_data), int(verbose)
        if input_shapes is not None and len(input_shapes) != len(self.feature_cols):
            raise ValueError(f"TorchEstimator: {len(input_shapes)} input_shapes for "
                             f"{len(self.feature_cols)} feature_cols; give one per column")
        self.input_shapes = [list(s) for s in input_shapes] if input_shapes else None
        self.last_fit_timings: dict = {}

    def _spec(self, data, run_id) -> TrainSpec:
        return TrainSpec(model=self.model, optimizer_class=type(self.optimizer),
                         optimizer_defaults=dict(self.optimizer.defaults),
                         optimizer_state=copy.deepcopy(self.optimizer.state_dict()),
                         loss=self.loss, feature_cols=self.feature_cols,
                         label_cols=self.label_cols, batch_size=self.batch_size,
                         val_batch_size=self.val_batch_size, epochs=self.epochs,
                         seed=self.random_seed, shuffle=self.shuffle, train_uri=data.train_uri,
                         val_uri=data.val_uri, store=self.store, run_id=run_id,
                         verbose=self.verbose, input_shapes=self.input_shapes)

    def fit(self, df):
        """Train on ``df``; returns a :class:`TorchModel` (see the module docstring).

        ``last_fit_timings`` then holds the seconds spent checking, writing the data, in the
        Spark job (ranks started, trained, returned), in rank 0's training loop (epochs,
        validation and checkpoints included) and building the model.
        """
        from .driver import active_context, run_on_spark
        from .torch_model import TorchModel
        t0 = time.perf_counter()
        kinds = check_columns(df, self.feature_cols, self.label_cols, self.validation)
        num_proc = int(self.num_proc or active_context().defaultParallelism)
        self.store.check_writable()
        t1 = time.perf_counter()
        data = write_once(df, self.store, self.feature_cols, self.label_cols, kinds,
                          self.validation, self.random_seed, min_rows=num_proc,
                          rewrite=self.rewrite_data)
        t2 = time.perf_counter()
        run_id = self.run_id or f"run-{uuid.uuid4().hex[:12]}"
        results = run_on_spark(train_on_rank, (self._spec(data, run_id),), None,
                               num_proc=num_proc, verbose=self.verbose)
        t3 = time.perf_counter()
        # The weights come from the store (rank 0's last checkpoint), not through the result
        # channel, whose values are size-capped.
        trained = copy.deepcopy(self.model)
        trained.load_state_dict(self.store.load_torch(self.store.checkpoint_path(run_id))["model"])
        model = TorchModel(trained, self.feature_cols, self.label_cols,
                           history=results[0]["history"], run_id=run_id,
                           input_shapes=self.input_shapes)
        self.last_fit_timings = {"check": t1 - t0, "write_data": t2 - t1, "data_reused":
                                 data.reused, "train_job": t3 - t2,
                                 "training_on_ranks": results[0]["train_seconds"],
                                 "build_model": time.perf_counter() - t3}
        return model
