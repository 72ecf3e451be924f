"""Case embedding: a training step of an embedding-heavy model (issue #20's target), ours
(engine_native.torch, ours_torch.py) against Horovod 0.28.1 (horovod.torch, over MPI and over
gloo), the same model, data and optimizer in the same run.

The model: a 1M x 64 float32 ``nn.Embedding(sparse=True)`` read as bags of 20 ids per sample
(mean), then Linear(64, 256), ReLU, Linear(256, 256), ReLU, Linear(256, 10); plain SGD, the
optimizer that takes sparse gradients; per-rank batch 32, ids drawn per rank. Each step's
gradients: one sparse embedding gradient (640 rows x 64 per rank, allgathered as indices and
values: Horovod's sparse path, and ours fused per step: Note [Deferred sparse gradients]) and
six dense tensors (~84 k floats, allreduced). ``broadcast_parameters`` (256 MiB) runs once
before timing and is not timed. Step time = the slowest rank's, median over steps. The
ranks' weights are compared after the run (equal sums: the step's averages agreed).

A second table says where the step's time goes: each rank times its forward, its backward
(the dense gradients' allreduces start from its hooks) and ``optimizer.step()`` (waiting for
those allreduces, the sparse gradient's allgather, then SGD); each phase is
the median over steps of the ranks' mean. ``--np 1,2`` adds the np=1 row, where the same
phases run without a peer: the compute's own cost on this machine.
"""

from __future__ import annotations

import time

import benchlib
from benchlib import Table, fmt_ratio, fmt_time, median

ROWS, DIM, BAG, BATCH = 1 << 20, 64, 20, 32
PHASES = ("forward", "backward", "optimizer step")
LABELS = {"ours-torch": "ours (torch API)", "ours-packed": "ours, packed sparse layout (before)",
          "horovod-mpi": "Horovod mpi", "horovod-gloo": "Horovod gloo"}
# Variant -> (system launched, extra spec): "ours-packed" runs this checkout's host sparse
# gradients through the packed layout (sparse_packed.py, the host path before part 10), an A/B
# of that change in the same run.
VARIANTS = {"ours-packed": ("ours-torch", {"sparse_layout": "packed"})}


# ---------------------------------------------------------------------------------------------
# Rank side

def _model(torch, rows: int):
    class EmbeddingNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embedding = torch.nn.Embedding(rows, DIM, sparse=True)
            self.head = torch.nn.Sequential(
                torch.nn.Linear(DIM, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                torch.nn.ReLU(), torch.nn.Linear(256, 10))

        def forward(self, ids):
            return self.head(self.embedding(ids).mean(1))

    torch.manual_seed(0)
    return EmbeddingNet()


def rank_run(adapter, spec: dict, init_end: float) -> dict:
    torch, hvd = adapter.torch, adapter.hvd
    torch.set_num_threads(1)
    if spec.get("sparse_layout") == "packed":
        from engine_native.torch import optimizer, sparse_packed
        optimizer.sparse_allreduce_fused = sparse_packed.sparse_allreduce_packed
    rows = spec.get("rows", ROWS)
    model = _model(torch, rows)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.05),
                                   named_parameters=model.named_parameters())
    gen = torch.Generator().manual_seed(1000 + adapter.rank)
    batches = [(torch.randint(0, rows, (BATCH, BAG), generator=gen),
                torch.randint(0, 10, (BATCH,), generator=gen)) for _ in range(8)]
    loss_fn = torch.nn.functional.cross_entropy

    def step(k):
        ids, target = batches[k % len(batches)]
        t0 = time.perf_counter()
        opt.zero_grad()
        loss = loss_fn(model(ids), target)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        return t1 - t0, t2 - t1, time.perf_counter() - t2

    t0 = time.perf_counter()
    for k in range(spec["warmup"]):
        step(k)
    steps = benchlib.agreed_iterations(adapter, spec, (time.perf_counter() - t0) /
                                       max(1, spec["warmup"]), spec["budget_s"], 5,
                                       spec["steps"], "agree.embedding")
    out = {"times": {}}
    if steps == 0:
        out["stopped"] = "deadline reached before the timed steps"
        return out
    adapter.barrier()
    times, phases = [], []
    for k in range(steps):
        t0 = time.perf_counter()
        phases.append(step(k))
        times.append(time.perf_counter() - t0)
    out["times"]["step"] = times
    for i, phase in enumerate(PHASES):
        out["times"][phase] = [p[i] for p in phases]
    out["weights"] = [float(p.detach().double().sum()) for p in model.parameters()]
    out["metrics"] = adapter.metrics()
    return out


# ---------------------------------------------------------------------------------------------
# Launcher side

def run(ctx) -> list:
    systems = ctx.systems("ours-torch", "horovod-mpi", "horovod-gloo")
    if "ours-torch" in systems:
        systems.insert(systems.index("ours-torch") + 1, "ours-packed")
    figures, phases = {}, {}
    for np_ranks in ctx.nps:
        for system in benchlib.alternate(systems, ctx.nps.index(np_ranks)):
            launched, extra = VARIANTS.get(system, (system, {}))
            spec = {"warmup": 3 if ctx.quick else 10, "steps": 20 if ctx.quick else 100,
                    "budget_s": 5.0 if ctx.quick else 20.0,
                    **({"rows": 4096, "steps": 5} if ctx.smoke else {}), **extra}
            results = ctx.run(launched, np_ranks, "embedding", spec,
                              label=f"embedding/{system}/np{np_ranks}")
            if not results or any("step" not in r["times"] for r in results):
                continue
            t = median(benchlib.per_iteration_max([r["times"]["step"] for r in results]))
            figures[(system, np_ranks)] = t
            ctx.figures[("embedding", system, np_ranks)] = {"time": t}
            phases[(system, np_ranks)] = [
                median([sum(v) / len(v) for v in zip(*[r["times"][p] for r in results])])
                for p in PHASES]
            if any(r["weights"] != results[0]["weights"] for r in results):
                ctx.notes.append(f"embedding/{system} np={np_ranks}: ranks' weights differ "
                                 "after the run: WRONG RESULT")
    return [_table(ctx, systems, figures), _phase_table(ctx, systems, figures, phases)]


def _table(ctx, systems: list, figures: dict) -> Table:
    t = Table("embedding step (1M x 64 sparse embedding + 3 dense layers, batch 32 per rank, "
              "SGD): median step time", ["np"] + [LABELS[s] for s in systems]
              + ["best Horovod / ours"])
    for np_ranks in ctx.nps:
        row = [figures.get((s, np_ranks)) for s in systems]
        ours = figures.get(("ours-torch", np_ranks))
        peers = [f for s, f in zip(systems, row) if f and s.startswith("horovod")]
        t.add(str(np_ranks), *[fmt_time(f) if f else "-" for f in row],
              fmt_ratio(min(peers) / ours) if ours and peers else "-")
    return t


def _phase_table(ctx, systems: list, figures: dict, phases: dict) -> Table:
    t = Table("embedding step: where the time goes (median over steps of the ranks' mean; "
              "the step column is the slowest rank's, as above)",
              ["np", "system"] + list(PHASES) + ["step"])
    for np_ranks in ctx.nps:
        for s in systems:
            if (s, np_ranks) in phases:
                t.add(str(np_ranks), LABELS[s], *[fmt_time(f) for f in phases[(s, np_ranks)]],
                      fmt_time(figures[(s, np_ranks)]))
    return t
