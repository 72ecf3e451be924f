"""TorchEstimator.fit end to end vs Spark's TorchDistributor on the same data (issue #22).

    python benchmarks/bench_estimator.py               # 200k rows x 32 features, 2 ranks
    python benchmarks/bench_estimator.py --rows 50000 --epochs 1

One local[2] Spark session; the same DataFrame (synthetic 10-class data), model (32-64-10 MLP),
optimizer (SGD), batch size and epochs for both:
  ours               TorchEstimator(num_proc=2).fit(df): writes the DataFrame to the store as
                     Parquet, trains on 2 ranks in barrier mode (ParquetShardReader +
                     DistributedOptimizer), returns a TorchModel. Timed twice: first fit (data
                     written) and a second fit (data reused). last_fit_timings splits each.
  TorchDistributor   pyspark.ml.torch.distributor.TorchDistributor(num_processes=2,
                     local_mode=True).run(fn): it only launches processes (torchrun), so the
                     DataFrame is written to Parquet first (timed as its data step) and fn is
                     what a user writes: DDP over gloo, pyarrow reading the rank's files into a
                     DataLoader with a DistributedSampler.
Overhead = wall time − time in the training loop on rank 0.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import load_average  # noqa: E402


def make_model():
    import torch
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def distributor_fn(path, epochs, batch_size, lr):
    """What a TorchDistributor user writes: DDP + their own data loading."""
    import time as _time

    import numpy as np
    import pyarrow.parquet as pq
    import torch
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler, TensorDataset
    dist.init_process_group("gloo")
    table = pq.read_table(path, columns=["features", "label"])
    x = torch.from_numpy(np.stack(table["features"].to_numpy(zero_copy_only=False))).float()
    y = torch.from_numpy(table["label"].to_numpy())
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    start = _time.perf_counter()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for xb, yb in DataLoader(data, batch_size=batch_size, sampler=sampler):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(xb), yb).backward()
            opt.step()
    seconds = _time.perf_counter() - start
    dist.destroy_process_group()
    return seconds


def synthetic_df(spark, rows):
    import numpy as np
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(10, 32))
    labels = rng.integers(0, 10, rows)
    feats = centers[labels] + rng.normal(scale=2.0, size=(rows, 32))
    data = [(feats[i].tolist(), int(labels[i])) for i in range(rows)]
    return spark.createDataFrame(data, "features array<double>, label long").repartition(4).cache()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=64)
    args = parser.parse_args(argv)
    import torch
    from pyspark.ml.torch.distributor import TorchDistributor
    from pyspark.sql import SparkSession

    from hvd_magic.spark import Store, TorchEstimator
    spark = (SparkSession.builder.master("local[2]").appName("bench-estimator")
             .config("spark.ui.enabled", "false").config("spark.driver.host", "127.0.0.1")
             .config("spark.driver.memory", "4g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = synthetic_df(spark, args.rows)
    df.count()
    rows = []
    with tempfile.TemporaryDirectory(prefix="hvd-bench-est-") as tmp:
        store = Store.create(os.path.join(tmp, "store"))
        for label in ("ours, first fit (writes data)", "ours, second fit (data reused)"):
            model = make_model()
            est = TorchEstimator(model=model, optimizer=torch.optim.SGD(model.parameters(),
                                                                        lr=0.05),
                                 loss=torch.nn.functional.cross_entropy,
                                 feature_cols=["features"], label_cols=["label"],
                                 batch_size=args.batch, epochs=args.epochs, num_proc=2,
                                 store=store, verbose=0)
            start = time.perf_counter()
            est.fit(df)
            wall = time.perf_counter() - start
            t = est.last_fit_timings
            rows.append((label, wall, t["write_data"], t["training_on_ranks"]))
        path = os.path.join(tmp, "distributor.parquet")
        start = time.perf_counter()
        df.write.parquet("file://" + path)
        written = time.perf_counter() - start
        train = TorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(
            distributor_fn, path, args.epochs, args.batch, 0.05)
        wall = time.perf_counter() - start
        rows.append(("TorchDistributor (+ its data step)", wall, written, train))
    spark.stop()
    print(f"\nEstimator end to end, {args.rows} rows x 32 features, 2 ranks, batch "
          f"{args.batch}, {args.epochs} epoch(s), local[2]; {load_average()}")
    print("| system | wall s | data step s | training loop s (rank 0) | overhead s |")
    print("|---|---|---|---|---|")
    for label, wall, data_s, train_s in rows:
        print(f"| {label} | {wall:.1f} | {data_s:.1f} | {train_s:.1f} | {wall - train_s:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
