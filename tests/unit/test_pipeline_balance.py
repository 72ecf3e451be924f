"""How the short form splits layers over stages (engine_native.torch.pipelining.balance): even
counts; by cost, the split whose costliest stage is cheapest (checked against every split of
small cases); and each layer's cost measured on a sample with its forward and backward, on a
clock the test controls, without touching the parameters' gradients."""
import itertools

import pytest
import torch

from engine_native.torch.pipelining import balance


def _splits(n, parts):
    for cuts in itertools.combinations(range(1, n), parts - 1):
        bounds = (0, *cuts, n)
        yield [bounds[i + 1] - bounds[i] for i in range(parts)]


def _cost_of(counts, costs):
    start, worst = 0, 0.0
    for c in counts:
        worst = max(worst, sum(costs[start:start + c]))
        start += c
    return worst


def test_even_counts_differ_by_at_most_one_larger_first():
    assert balance.even(10, 3) == [4, 3, 3]
    assert balance.even(8, 4) == [2, 2, 2, 2]
    assert balance.even(5, 5) == [1] * 5


def test_by_cost_finds_the_split_with_the_cheapest_costliest_stage():
    rng = torch.Generator().manual_seed(0)
    for n in range(1, 9):
        for parts in range(1, n + 1):
            costs = (torch.rand(n, generator=rng) * 10).tolist()
            got = balance.by_cost(costs, parts)
            assert len(got) == parts and sum(got) == n and min(got) >= 1, (costs, got)
            best = min(_cost_of(s, costs) for s in _splits(n, parts))
            assert _cost_of(got, costs) == pytest.approx(best), (costs, parts, got)
    assert balance.by_cost([5, 1, 1, 1, 1, 1], 2) == [1, 5]


class _Clock:
    now = 0.0

    def __call__(self):
        return self.now


CLOCK = _Clock()  # module-level: the layers' copies advance this same clock


class _Costly(torch.nn.Module):
    """A Linear whose forward advances the test's clock by ``seconds``; a BatchNorm after it
    (running statistics) and dropout (random numbers) that timing must leave as they were."""

    def __init__(self, seconds):
        super().__init__()
        self.seconds = seconds
        self.linear = torch.nn.Linear(3, 3)
        self.norm = torch.nn.BatchNorm1d(3)
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        CLOCK.now += self.seconds
        return self.drop(self.norm(self.linear(x)))


def test_layer_costs_time_each_layer_on_the_sample(monkeypatch):
    monkeypatch.setattr(balance.time, "perf_counter", CLOCK)
    layers = [_Costly(s) for s in (0.5, 0.1, 0.2)] + [torch.nn.Tanh()]
    before = [{k: v.clone() for k, v in layer.state_dict().items()} for layer in layers]
    torch.manual_seed(3)
    costs = balance.layer_costs(layers, torch.randn(4, 3))
    assert costs == pytest.approx([0.5, 0.1, 0.2, 0.0])
    assert all(p.grad is None for layer in layers for p in layer.parameters())
    assert all(torch.equal(v, layer.state_dict()[k])
               for layer, state in zip(layers, before) for k, v in state.items())
    after_timing = torch.rand(1)
    torch.manual_seed(3)
    torch.randn(4, 3)
    assert torch.equal(after_timing, torch.rand(1))  # the random stream is where it was
    assert balance.by_cost(costs, 2) == [1, 3]
