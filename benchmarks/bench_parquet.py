"""Reading throughput per rank from one Parquet dataset: ParquetShardReader vs its peers (#22).

    python benchmarks/bench_parquet.py                 # 1M rows x 32 float32 features, 2 ranks
    python benchmarks/bench_parquet.py --rows 200000 --rounds 1

Systems, each run as ``--size`` concurrent rank processes reading their share of the same files
(one epoch, batches of ``--batch`` rows stacked into a [batch, 32] float tensor plus labels, the
same consumer work for all):
  ours       engine_native.data.ParquetShardReader (its defaults: 2 decoding threads, shuffled)
  pyarrow    pyarrow.parquet.read_table of the rank's files into a TensorDataset, read through
             torch.utils.data.DataLoader(shuffle=True) — the plain approach
  petastorm  petastorm.make_batch_reader(cur_shard, shard_count) + petastorm.pytorch.DataLoader,
             their defaults, from the venv benchmarks/petastorm_venv.sh builds
             (--petastorm-python; the row is marked missing if that python cannot import it)
Rows/s per rank = rows the rank read / its wall time from opening the reader to the last batch
(imports excluded);
the table gives the median over ranks and rounds; systems alternate within each round.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from benchlib import fmt_ratio, load_average, median  # noqa: E402

FEATURES = [f"f{i}" for i in range(32)]
PETASTORM_PYTHON = os.path.join(HERE, ".venv-petastorm", "bin", "python")


def make_dataset(path: str, rows: int, files: int = 8) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq
    rng = np.random.default_rng(0)
    per_file = rows // files
    for i in range(files):
        n = per_file if i < files - 1 else rows - per_file * (files - 1)
        cols = {name: rng.standard_normal(n, dtype=np.float32) for name in FEATURES}
        cols["label"] = rng.integers(0, 10, n)
        pq.write_table(pa.table(cols), os.path.join(path, f"part-{i:05d}.parquet"),
                       row_group_size=32768)


def read_ours(path, rank, size, batch):
    import torch
    from engine_native.data import ParquetShardReader
    rows = 0
    for b in ParquetShardReader(path, batch, FEATURES + ["label"], rank=rank, size=size):
        torch.stack([b[c] for c in FEATURES], 1)  # the batch a training step would take
        rows += len(b["label"])
    return rows


def read_pyarrow(path, rank, size, batch):
    import numpy as np
    import pyarrow.parquet as pq
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    files = sorted(f for f in os.listdir(path) if f.endswith(".parquet"))[rank::size]
    tables = [pq.read_table(os.path.join(path, f), columns=FEATURES + ["label"]) for f in files]
    x = torch.from_numpy(np.stack([np.concatenate([t[c].to_numpy() for t in tables])
                                   for c in FEATURES], 1))
    y = torch.from_numpy(np.concatenate([t["label"].to_numpy() for t in tables]))
    rows = 0
    for xb, yb in DataLoader(TensorDataset(x, y), batch_size=batch, shuffle=True):
        rows += len(yb)
    return rows


def read_petastorm(path, rank, size, batch):
    import torch
    from petastorm import make_batch_reader
    from petastorm.pytorch import DataLoader
    rows = 0
    with make_batch_reader("file://" + path, cur_shard=rank, shard_count=size, num_epochs=1,
                           schema_fields=FEATURES + ["label"]) as reader:
        for b in DataLoader(reader, batch_size=batch):
            torch.stack([b[c] for c in FEATURES], 1)  # the same work as read_ours
            rows += len(b["label"])
    return rows


READERS = {"ours": read_ours, "pyarrow": read_pyarrow, "petastorm": read_petastorm}
# Imported before the clock starts: a rank pays them once per job, not per epoch.
IMPORTS = {"ours": ["torch", "engine_native.data"],
           "pyarrow": ["torch", "torch.utils.data", "pyarrow.parquet"],
           "petastorm": ["torch", "petastorm", "petastorm.pytorch"]}


def worker(args) -> None:
    import importlib
    for module in IMPORTS[args.worker]:
        importlib.import_module(module)
    start = time.perf_counter()
    rows = READERS[args.worker](args.path, args.rank, args.size, args.batch)
    print(json.dumps({"rows": rows, "seconds": time.perf_counter() - start}))


def run_system(system, args, python) -> list:
    """Per-rank rows/s of one concurrent run of ``args.size`` ranks; [] when it failed."""
    cmd = [python, os.path.abspath(__file__), "--worker", system, "--path", args.path,
           "--size", str(args.size), "--batch", str(args.batch)]
    procs = [subprocess.Popen(cmd + ["--rank", str(r)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in range(args.size)]
    rates = []
    for p in procs:
        out, err = p.communicate(timeout=900)
        if p.returncode != 0:
            print(f"[{system}] rank failed:\n{err[-2000:]}", file=sys.stderr)
            return []
        got = json.loads(out.strip().splitlines()[-1])
        rates.append(got["rows"] / got["seconds"])
    return rates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=2)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--petastorm-python", default=PETASTORM_PYTHON)
    parser.add_argument("--worker", choices=sorted(READERS), help=argparse.SUPPRESS)
    parser.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--path", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    pythons = {"ours": sys.executable, "pyarrow": sys.executable,
               "petastorm": args.petastorm_python}
    if subprocess.run([args.petastorm_python, "-c", "import petastorm.pytorch"],
                      capture_output=True).returncode != 0:
        print(f"petastorm: {args.petastorm_python} cannot import petastorm.pytorch "
              f"(bash benchmarks/petastorm_venv.sh builds it): its row is missing")
        del pythons["petastorm"]
    with tempfile.TemporaryDirectory(prefix="hvd-bench-parquet-") as tmp:
        args.path = tmp
        make_dataset(tmp, args.rows)
        rates = {s: [] for s in pythons}
        for round_ in range(args.rounds):
            order = list(pythons)[round_ % len(pythons):] + list(pythons)[:round_ % len(pythons)]
            for system in order:
                rates[system] += run_system(system, args, pythons[system])
    ours = median(rates["ours"])
    print(f"\nParquet read, {args.rows} rows x {len(FEATURES)} float32 + label, "
          f"{args.size} ranks, batch {args.batch}, {args.rounds} round(s); {load_average()}")
    print("| reader | rows/s per rank (median) | ours / it |")
    print("|---|---|---|")
    for system, got in rates.items():
        rate = median(got)
        print(f"| {system} | {rate / 1e6:.2f} M | {fmt_ratio(ours / rate) if got else 'failed'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
