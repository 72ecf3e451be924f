"""Autotune in the running core: rank 0 tunes through warmup -> bayes -> categorical -> done,
every rank switches parameters at the same point of the response stream, user-set knobs stay
fixed, the CSV log is written, and set_autotune switches tuning at run time.

Small HVD_AUTOTUNE_* settings keep a full tuning run to a few dozen training steps.
"""
import csv

import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import Failures
from multiproc.harness import run_ranks

TENSORS = 6
SMALL_TUNING = {"HVD_AUTOTUNE": "1", "HVD_AUTOTUNE_WARMUP_SAMPLES": "1",
                "HVD_AUTOTUNE_STEPS_PER_SAMPLE": "2", "HVD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES": "4"}
# warmup 1 sample + a Bayesian budget of 4 (2 proposals, then both re-measured in turn as the
# finalists, one step discarded per switch) + 2 cache settings, 5 samples of 2 steps per
# setting, plus margin for the step that closes each sample.
STEPS = 2 + (4 + 2) * 5 * 2 + 2 * 5 + 20
PHASES = ["warmup", "bayes", "categorical", "done"]


def _step(hvd, fails, step):
    """One training step: TENSORS gradients of different sizes, reduced asynchronously."""
    n, me = hvd.size(), hvd.rank()
    grads = [np.full(100 * (i + 1), me + step + i, np.float32) for i in range(TENSORS)]
    handles = [hvd.allreduce_async(g, op=hvd.Sum, name=f"grad.{i}") for i, g in enumerate(grads)]
    for i, h in enumerate(handles):
        out = hvd.synchronize(h)
        expected = sum(r + step + i for r in range(n))
        if not np.all(out == expected):
            fails.expect(f"step {step} grad.{i}", False, f"got {out[:3]}, expected {expected}")


def _ordered_phases(seen):
    out = []
    for phase in seen:
        if not out or out[-1] != phase:
            out.append(phase)
    return out


def tuning_suite(steps):
    hvd = checks.init("shm")
    fails = Failures()
    seen, trace = [], []
    for step in range(steps):
        _step(hvd, fails, step)
        state = hvd.autotune_state()
        seen.append(state["phase"])
        trace.append((state["applied_phase"], state["applied"]))
    hvd.barrier()  # every rank has executed every response: switch lists are complete
    state = hvd.autotune_state()
    panel = hvd.metrics()["autotune"]
    hvd.shutdown()
    fails.raise_if_any()
    return {"seen": _ordered_phases(seen), "state": state, "panel": panel, "trace": trace}


def _check_same_switches(results):
    # After every step each rank runs with the same parameters (and phase) as rank 0 ...
    traces = [r.value["trace"] for r in results if "trace" in r.value]
    for r, t in enumerate(traces[1:], start=1):
        assert t == traces[0], f"rank {r} differs from rank 0 after step " + str(
            next(i for i, (a, b) in enumerate(zip(t, traces[0])) if a != b))
    # ... because every switch happened between the same two responses on every rank.
    switches = [r.value["state"]["switches"] for r in results]
    for r, s in enumerate(switches[1:], start=1):
        assert s == switches[0], f"rank {r} switched differently from rank 0:\n{s}\n{switches[0]}"
    points = [s["responses_before"] for s in switches[0]]
    assert points == sorted(points), points
    return switches[0]


def test_autotune_phases_and_synchronous_switches(tmp_path):
    log = tmp_path / "autotune.csv"
    env = dict(SMALL_TUNING, HVD_AUTOTUNE_LOG=str(log))
    results = run_ranks(tuning_suite, 3, env=env, args=(STEPS,), timeout=240)
    tuner = results[0].value["state"]
    assert tuner["tuner"] is True and tuner["enabled"] is True
    assert results[0].value["seen"] == PHASES, results[0].value["seen"]
    # 2 Bayesian settings, the same 2 re-measured as finalists, then the cache off and on.
    assert tuner["phase"] == "done" and len(tuner["history"]) == 6, tuner["history"]
    assert [h["phase"] for h in tuner["history"]] == ["bayes"] * 4 + ["categorical"] * 2
    assert ({str(h["params"]) for h in tuner["history"][2:4]} ==
            {str(h["params"]) for h in tuner["history"][:2]})
    assert {h["params"]["cache_enabled"] for h in tuner["history"][4:]} == {False, True}
    assert tuner["applied"] == tuner["best"], (tuner["applied"], tuner["best"])
    # The best is a measured setting with its measured score (the Bayesian phase keeps the one
    # its model rates highest, which need not be the luckiest sample).
    assert tuner["best_score"] > 0 and any(
        h["params"] == tuner["best"] and h["score"] == tuner["best_score"]
        for h in tuner["history"]), (tuner["best"], tuner["history"])
    switches = _check_same_switches(results)
    assert len(switches) >= 3, switches
    assert switches[-1]["params"] == tuner["best"] and switches[-1]["phase"] == "done"
    for r in results[1:]:
        state = r.value["state"]
        assert state["tuner"] is False and state["phase"] == "done", state
        assert state["applied"] == tuner["applied"], (state["applied"], tuner["applied"])
        # The phase travels with every update: the other ranks see rank 0's phases in order.
        assert r.value["seen"] in (PHASES, ["off"] + PHASES), r.value["seen"]
    panel = results[0].value["panel"]
    assert panel["enabled"] is True and panel["phase"] == "done"
    assert panel["sample"] == panel["samples"] == 6, panel
    assert [s[0] for s in panel["scores"]] == list(range(1, 7)), panel["scores"]
    # CSV: Horovod's header, one row per scored setting, the best setting last.
    with open(log) as fh:
        rows = list(csv.reader(fh))
    assert rows[0] == ["hierarchical_allreduce", "hierarchical_allgather", "torus_allreduce",
                       "cache_enabled", "cycle_time_ms", "tensor_fusion_threshold", "score"]
    assert len(rows) == 1 + 6 + 1, rows
    scores = [float(row[-1]) for row in rows[1:]]
    assert rows[-1] in rows[1:-1] and scores[-1] == pytest.approx(tuner["best_score"]), rows
    best_mib = tuner["best"]["fusion_threshold_bytes"] / 2 ** 20
    assert abs(float(rows[-1][5]) - best_mib) < 1e-6, (rows[-1], best_mib)


def test_env_table_lists_the_autotune_knobs():
    import engine_native as hvd
    table = {name: (alias, default) for name, alias, _, default, _ in hvd.config_table()}
    assert table["HVD_AUTOTUNE"] == ("HOROVOD_AUTOTUNE", "false")
    assert table["HVD_AUTOTUNE_LOG"] == ("HOROVOD_AUTOTUNE_LOG", "")
    assert table["HVD_AUTOTUNE_WARMUP_SAMPLES"] == ("HOROVOD_AUTOTUNE_WARMUP_SAMPLES", "3")
    assert table["HVD_AUTOTUNE_STEPS_PER_SAMPLE"] == ("HOROVOD_AUTOTUNE_STEPS_PER_SAMPLE", "10")
    assert table["HVD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES"] == (
        "HOROVOD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES", "20")
    assert table["HVD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE"] == (
        "HOROVOD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE", "0.8")


def test_user_set_fusion_threshold_is_not_tuned():
    # Horovod's names: the aliases turn tuning on and fix the threshold just the same.
    env = {k.replace("HVD_", "HOROVOD_"): v for k, v in SMALL_TUNING.items()}
    env["HOROVOD_FUSION_THRESHOLD"] = "1048576"
    results = run_ranks(tuning_suite, 2, env=env, args=(STEPS,), timeout=240)
    tuner = results[0].value["state"]
    assert tuner["phase"] == "done", tuner["phase"]
    fusions = {h["params"]["fusion_threshold_bytes"] for h in tuner["history"]}
    assert fusions == {1 << 20}, fusions
    cycles = {h["params"]["cycle_time_ms"] for h in tuner["history"]}
    assert len(cycles) > 1, f"cycle time is still tuned: {cycles}"
    switches = _check_same_switches(results)
    assert all(s["params"]["fusion_threshold_bytes"] == 1 << 20 for s in switches), switches


def runtime_switch_suite(steps):
    """set_autotune(True) mid-job starts a run from the parameters in force; set_autotune(False)
    stops it and settles every rank on the best setting scored so far."""
    hvd = checks.init("shm")
    fails = Failures()
    before = hvd.autotune_state()
    fails.expect("off at start", before["phase"] == "off" and not before["enabled"], f"{before}")
    fails.expect("no panel while off", hvd.metrics()["autotune"] is None)
    for step in range(3):
        _step(hvd, fails, step)
    hvd.set_autotune(True)
    for step in range(3, steps):
        _step(hvd, fails, step)
    mid = hvd.autotune_state()
    hvd.set_autotune(False)
    for step in range(steps, steps + 6):  # the settling switch travels with the next batch
        _step(hvd, fails, step)
    hvd.barrier()
    state = hvd.autotune_state()
    hvd.shutdown()
    fails.raise_if_any()
    return {"mid": mid, "state": state}


def test_set_autotune_at_run_time():
    env = {k: v for k, v in SMALL_TUNING.items() if k != "HVD_AUTOTUNE"}
    # Enough steps to score a few Bayesian settings, not to finish.
    results = run_ranks(runtime_switch_suite, 2, env=env, args=(2 + 3 * 5 * 2,), timeout=240)
    tuner = results[0].value
    assert tuner["mid"]["tuner"] is True and tuner["mid"]["phase"] in ("bayes", "categorical")
    assert tuner["state"]["phase"] == "off" and tuner["state"]["enabled"] is False
    scored = tuner["state"]["history"]
    assert scored, tuner["state"]
    switches = _check_same_switches(results)
    assert switches and switches[-1]["params"] == tuner["state"]["best"], switches
    assert results[1].value["state"]["applied"] == tuner["state"]["best"]
