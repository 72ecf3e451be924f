"""How many consecutive layers each pipeline stage gets: even counts, or by the layers' measured
cost (GPipe's estimate: each layer's forward and backward timed on a sample)."""
from __future__ import annotations

import copy
import time

import torch


def even(layers: int, parts: int) -> list[int]:
    """``parts`` counts, as equal as possible, the larger ones first."""
    return [layers // parts + (i < layers % parts) for i in range(parts)]


def by_cost(costs: list[float], parts: int) -> list[int]:
    """Contiguous counts (each >= 1) that make the costliest part as cheap as possible."""
    n = len(costs)
    prefix = [0.0]
    for c in costs:
        prefix.append(prefix[-1] + c)
    inf = float("inf")
    # best[p][i]: the least possible maximum over p parts of the first i layers; cut: where
    # the last of those parts starts
    best = [[inf] * (n + 1) for _ in range(parts + 1)]
    cut = [[0] * (n + 1) for _ in range(parts + 1)]
    best[0][0] = 0.0
    for p in range(1, parts + 1):
        for i in range(p, n - (parts - p) + 1):
            for j in range(p - 1, i):
                worst = max(best[p - 1][j], prefix[i] - prefix[j])
                if worst < best[p][i]:
                    best[p][i], cut[p][i] = worst, j
    counts, i = [], n
    for p in range(parts, 0, -1):
        counts.append(i - cut[p][i])
        i = cut[p][i]
    return counts[::-1]


def layer_costs(layers: list, sample: torch.Tensor) -> list[float]:
    """Seconds of each layer's forward and backward on ``sample`` run through the layers before
    it (the second of two runs: the first pays for allocation). Runs on copies of the layers
    with the random state restored after, so parameters, their ``.grad``, running statistics
    and the random stream are as before."""
    costs = [0.0] * len(layers)
    with torch.random.fork_rng():
        _time_layers(copy.deepcopy(layers), sample, costs)
    return costs


def _time_layers(layers: list, sample: torch.Tensor, costs: list) -> None:
    for _ in range(2):
        x = sample.detach()
        for i, layer in enumerate(layers):
            start = time.perf_counter()
            x_in = x.detach().requires_grad_(x.is_floating_point())
            out = layer(x_in)
            wrt = [t for t in (x_in, *layer.parameters()) if t.requires_grad]
            if out.requires_grad and wrt:
                torch.autograd.grad(out, wrt, grad_outputs=torch.ones_like(out),
                                    allow_unused=True)
            costs[i] = time.perf_counter() - start
            x = out.detach()
