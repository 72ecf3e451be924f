"""The autotuning state machine through ``engine_native._hooks.ParameterManagerForTest``: the
runtime's calls (update per step, current params) driven by a synthetic throughput model.
Checks warm-up, the Bayesian then categorical chain, fixed knobs, medians, the state readable at
any time and the CSV log."""
import csv
import math

import pytest

from native.build_testhooks import load

_hooks = load()  # the test-only extension (tests/native): built here if needed

MIB = 1 << 20
STEP_BYTES = 64 * MIB
CSV_COLUMNS = ["hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce",
               "cache_enabled", "cycle_time_ms", "tensor_fusion_threshold", "score"]


# The search axes (Note [Fusion axis]): the fusion threshold as log2(bytes) from 13.5 (fusion
# off, 0 bytes) to log2 of the box's top (128 MiB here: the default initial threshold), the
# cycle time linear over 0..50 ms.
FUSION_AXIS = (13.5, 27.0)
CYCLE_AXIS = (0.0, 50.0)


def fusion_axis(nbytes):
    return FUSION_AXIS[0] if nbytes <= 0 else max(14.0, math.log2(nbytes))


def throughput(p):
    """Bytes per second of a made-up job, smooth on the search axes: best at 2 MiB fusion
    (log2 21) and 6 ms cycles, cache on."""
    a = (fusion_axis(p["fusion_threshold_bytes"]) - 21.0) / (FUSION_AXIS[1] - FUSION_AXIS[0])
    b = (p["cycle_time_ms"] - 6.0) / (CYCLE_AXIS[1] - CYCLE_AXIS[0])
    rate = 1e9 * math.exp(-4.0 * a * a - 6.0 * b * b)
    rate *= 1.1 if p["cache_enabled"] else 1.0
    rate *= 1.05 if p["hierarchical_allreduce"] else 1.0
    return rate


def run(manager, max_steps=100000, rate=throughput):
    """Feeds steps timed by `rate` until tuning is done; returns the steps used and changes."""
    changes = 0
    for step in range(max_steps):
        if manager.state()["phase"] == "done":
            return step, changes
        before = manager.current_params()
        changed = manager.update(STEP_BYTES, STEP_BYTES / rate(before))
        assert changed == (manager.current_params() != before)
        changes += changed
    raise AssertionError("tuning did not finish")


def small(**kwargs):
    options = {"warmup_samples": 1, "steps_per_sample": 2, "samples_per_setting": 3,
               "bayes_max_samples": 12, "seed": 3}
    options.update(kwargs)
    return _hooks.ParameterManagerForTest(**options)


def test_warmup_samples_are_discarded():
    m = _hooks.ParameterManagerForTest(warmup_samples=3, steps_per_sample=2)
    state = m.state()
    assert (state["phase"], state["trial"], state["trials"]) == ("warmup", 1, 3)
    for _ in range(5):
        assert m.update(1000, 1.0) is False
    assert (m.state()["phase"], m.state()["trial"]) == ("warmup", 3)
    m.update(1000, 1.0)
    state = m.state()
    assert (state["phase"], state["trial"], state["history"]) == ("bayes", 1, [])


def test_full_chain_single_host():
    m = small()
    initial = m.current_params()
    steps, changes = run(m)
    state = m.state()
    phases = [h["phase"] for h in state["history"]]
    # The Bayesian budget of 12: 8 proposals, then 4 finalists (3 + the start) re-measured.
    assert phases == ["bayes"] * 12 + ["categorical"] * 2
    # warm-up + settings x samples, x steps per sample; + one discarded step per switch of
    # the interleaved finalists (4 x 3) and on/off trials (2 x 3)
    assert steps == (1 + len(phases) * 3) * 2 + 4 * 3 + 2 * 3
    assert changes >= 10
    assert state["history"][0]["params"] == initial  # the starting setting is the baseline
    cats = state["history"][12:]
    assert [c["params"]["cache_enabled"] for c in cats] == [False, True]
    assert all(not h["params"]["hierarchical_allreduce"] for h in state["history"])
    assert (state["trial"], state["trials"]) == (len(phases), len(phases))
    assert initial in [h["params"] for h in state["history"][8:12]]


def test_finalists_are_compared_under_the_same_load():
    """The machine's load drifts (here: throughput halves over the run). Settings measured one
    after another are compared under different loads; the finalists, re-measured in turn, are
    not, so the truly best of them is kept even though it was first measured when slow."""
    seen = {"steps": 0}

    def drifting(p):
        seen["steps"] += 1
        return throughput(p) * (1.0 / (1.0 + seen["steps"] / 100.0))

    m = small(finalists=3, fixed_cache=True)
    run(m, rate=drifting)
    state = m.state()
    finals = [h for h in state["history"] if h["phase"] == "bayes"][8:]
    assert len(finals) == 4
    truth = [throughput(h["params"]) for h in finals]
    assert state["best"] == finals[truth.index(max(truth))]["params"], (finals, truth)
    assert m.current_params() == state["best"]


def test_no_finalists_when_disabled():
    m = small(finalists=0)
    run(m)
    assert [h["phase"] for h in m.state()["history"]] == ["bayes"] * 12 + ["categorical"] * 2


@pytest.mark.parametrize("budget, finalists", [(3, 0), (4, 2), (6, 3), (12, 4), (20, 4)])
def test_finalists_come_out_of_the_bayesian_budget(budget, finalists):
    """Issue #4's budget: the Bayesian phase scores bayes_max_samples settings, finalists
    included. They reserve finalists + 1 (3 + the start), at most half the budget, and none
    when fewer than 2 would be left."""
    m = small(bayes_max_samples=budget, fixed_cache=True)
    trials = set()
    while m.state()["phase"] != "done":
        state = m.state()
        if state["phase"] == "bayes":
            trials.add(state["trials"])
            assert 1 <= state["trial"] <= state["trials"]
        m.update(STEP_BYTES, STEP_BYTES / throughput(m.current_params()))
    history = [h["params"] for h in m.state()["history"]]
    assert len(history) == budget and trials == {budget}
    proposed, finals = history[:budget - finalists], history[budget - finalists:]
    assert len({str(p) for p in proposed}) == len(proposed)
    assert len({str(p) for p in finals}) == len(finals)
    assert all(p in proposed for p in finals)
    assert finalists == 0 or history[0] in finals


def test_hierarchical_is_tuned_only_with_several_hosts():
    m = small(num_hosts=2)
    run(m)
    cats = [h["params"] for h in m.state()["history"] if h["phase"] == "categorical"]
    assert [(c["hierarchical_allreduce"], c["cache_enabled"]) for c in cats][:2] == [
        (False, True), (True, True)]
    assert [c["cache_enabled"] for c in cats[2:]] == [False, True]
    assert all(c["hierarchical_allreduce"] for c in cats[2:])  # the better value is kept
    assert m.current_params()["hierarchical_allreduce"] is True


@pytest.mark.parametrize("seed", [1, 3, 7])
def test_best_is_applied_when_done_and_near_the_optimum(seed):
    """The tuner finds the maximum of a smooth 2-D function within the sample budget: the
    best setting lies within a tenth of each search axis of the optimum."""
    m = small(bayes_max_samples=20, seed=seed)
    run(m)
    state = m.state()
    # The best is a measured setting with its measured score (the Bayesian phase keeps the
    # one its model rates highest, which need not be the largest sample).
    assert {"params": state["best"], "score": state["best_score"]} in [
        {"params": h["params"], "score": h["score"]} for h in state["history"]]
    assert m.current_params() == state["best"] == state["current"]
    assert state["best"]["cache_enabled"] is True
    top = throughput({"fusion_threshold_bytes": 2 * MIB, "cycle_time_ms": 6.0,
                      "cache_enabled": True, "hierarchical_allreduce": False})
    assert state["best_score"] > 0.9 * top
    best = state["best"]
    fusion_span, cycle_span = FUSION_AXIS[1] - FUSION_AXIS[0], CYCLE_AXIS[1] - CYCLE_AXIS[0]
    assert abs(fusion_axis(best["fusion_threshold_bytes"]) - 21.0) < 0.1 * fusion_span, best
    assert abs(best["cycle_time_ms"] - 6.0) < 0.1 * cycle_span, best
    assert m.update(STEP_BYTES, 1.0) is False  # done: nothing changes any more


def test_score_is_bytes_per_second_median_of_samples():
    m = _hooks.ParameterManagerForTest(warmup_samples=0, steps_per_sample=2,
                                      samples_per_setting=3, bayes_max_samples=1,
                                      fixed_cache=True)
    for seconds in (1.0, 1.0, 0.01, 0.01, 0.5, 0.5):  # samples 1000, 100000, 2000 bytes/s
        m.update(1000, seconds)
    (trial,) = m.state()["history"]
    assert trial["score"] == pytest.approx(2000.0)


def test_fixed_knobs_are_not_searched():
    m = small(fusion_threshold_bytes=8 * MIB, fixed_fusion_threshold=True, fixed_cache=True)
    run(m)
    history = m.state()["history"]
    assert {h["params"]["fusion_threshold_bytes"] for h in history} == {8 * MIB}
    assert {h["params"]["cache_enabled"] for h in history} == {True}
    assert len({h["params"]["cycle_time_ms"] for h in history}) > 5
    assert all(h["phase"] == "bayes" for h in history)


def test_only_categorical_when_both_continuous_knobs_are_fixed():
    m = small(fixed_fusion_threshold=True, fixed_cycle_time=True)
    run(m)
    assert [h["phase"] for h in m.state()["history"]] == ["categorical"] * 2


def test_nothing_to_tune_is_done_at_once():
    m = _hooks.ParameterManagerForTest(fixed_fusion_threshold=True, fixed_cycle_time=True,
                                      fixed_cache=True, num_hosts=4, fixed_hierarchical=True)
    state = m.state()
    assert state["phase"] == "done" and state["history"] == []
    assert m.update(1 << 20, 0.1) is False


def test_search_box_covers_the_initial_setting():
    m = small(fusion_threshold_bytes=128 * MIB, cycle_time_ms=75.0, fusion_max_bytes=64 * MIB,
              cycle_max_ms=50.0)
    run(m)
    for h in m.state()["history"]:
        p = h["params"]
        assert 0 <= p["fusion_threshold_bytes"] <= 128 * MIB
        assert p["fusion_threshold_bytes"] % 4096 == 0
        assert 0.0 <= p["cycle_time_ms"] <= 75.0


def test_state_is_consistent_while_tuning():
    m = small()
    seen = set()
    for _ in range(60):
        state = m.state()
        seen.add(state["phase"])
        assert 1 <= state["trial"] <= state["trials"]
        assert 0 <= state["samples"] < 3
        assert state["current"] == m.current_params()
        if state["history"]:
            assert state["best_score"] == max(h["score"] for h in state["history"])
        m.update(STEP_BYTES, STEP_BYTES / throughput(m.current_params()))
    assert {"warmup", "bayes"} <= seen


def test_same_seed_same_trials():
    one, two = small(seed=9), small(seed=9)
    run(one)
    run(two)
    assert one.state()["history"] == two.state()["history"]


def test_csv_log(tmp_path):
    path = tmp_path / "autotune.csv"
    m = small(log_path=str(path), bayes_max_samples=5)
    run(m)
    with open(path) as fh:
        rows = list(csv.reader(fh))
    state = m.state()
    assert rows[0] == CSV_COLUMNS
    body = rows[1:]
    assert len(body) == len(state["history"]) + 1  # one row per setting, then the best
    for row, trial in zip(body, state["history"]):
        p = trial["params"]
        assert row[:4] == [str(int(p["hierarchical_allreduce"])), "0", "0",
                           str(int(p["cache_enabled"]))]
        assert float(row[4]) == pytest.approx(p["cycle_time_ms"])
        assert float(row[5]) == pytest.approx(p["fusion_threshold_bytes"] / MIB, rel=1e-5)
        assert float(row[6]) == pytest.approx(trial["score"], rel=1e-6)
    best = state["best"]
    assert float(body[-1][5]) == pytest.approx(best["fusion_threshold_bytes"] / MIB, rel=1e-5)
    assert float(body[-1][6]) == pytest.approx(state["best_score"], rel=1e-6)


def test_unwritable_log_does_not_stop_tuning(tmp_path):
    m = small(log_path=str(tmp_path / "no-such-dir" / "log.csv"), bayes_max_samples=3)
    run(m)
    assert m.state()["phase"] == "done"


def test_zero_time_steps_score_zero_without_crashing():
    m = small(bayes_max_samples=2)
    run(m, rate=lambda p: float("inf"))
    assert all(h["score"] == 0.0 for h in m.state()["history"])


def test_fusion_threshold_is_searched_on_a_log_axis():
    """Note [Fusion axis]: proposals spread over orders of magnitude (a linear 0..128 MiB axis
    put nearly all of them above 4 MiB), and threshold 0 (fusion off) is a point of the box."""
    m = small(bayes_max_samples=20, fixed_cache=True)
    run(m)
    sizes = [h["params"]["fusion_threshold_bytes"] for h in m.state()["history"]]
    assert all(s == 0 or s >= 16 * 1024 for s in sizes)
    assert any(0 < s <= 4 * MIB for s in sizes)


def test_fusion_off_is_reachable():
    """The lower end of the fusion axis is threshold 0: a job that runs best without fusion
    gets it."""
    def no_fusion(p):
        return 1e9 * (2.0 if p["fusion_threshold_bytes"] == 0 else
                      1.0 / (1.0 + fusion_axis(p["fusion_threshold_bytes"]) - 14.0))

    m = small(bayes_max_samples=20, fixed_cache=True, fixed_cycle_time=True)
    run(m, rate=no_fusion)
    assert m.state()["best"]["fusion_threshold_bytes"] == 0


def test_on_off_trials_are_compared_under_the_same_load():
    """Note [Categorical trials]: off and on are measured interleaved, so a load that halves
    throughput midway through the trial does not make the value measured first look better."""
    seen = {"steps": 0}

    def drifting(p):
        seen["steps"] += 1
        return throughput(p) * (1.0 / (1.0 + seen["steps"] / 20.0))

    m = small(fixed_fusion_threshold=True, fixed_cycle_time=True, samples_per_setting=5)
    run(m, rate=drifting)
    history = m.state()["history"]
    assert [h["params"]["cache_enabled"] for h in history] == [False, True]
    assert m.state()["best"]["cache_enabled"] is True
    assert m.current_params()["cache_enabled"] is True
