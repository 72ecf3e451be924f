"""Elastic ranks in the notebook (issue #21): ``%hvd_scale`` grows 2 → 4 and shrinks a running
cluster keeping the ranks' variables; a rank SIGKILLed during an ``@hvd.elastic.run`` cell is
dropped, the survivors restore the last commit, re-form and finish (no committed step lost or
repeated, the accuracy of an uninterrupted run); the dashboard shows the change and the dead
rank; ``%hvd_scale`` adds a replacement; a death below ``--min-np`` fails the cell cleanly.

One cluster for the module (local launcher, 2 ranks to begin with), its tests in order."""

import time

import pytest
from cluster_harness import magics, start_cluster
from conftest import parked_cluster

from hvd_magic import scale
from hvd_magic.errors import HvdError, RankError

pytestmark = pytest.mark.timeout(300)

SHOW = ("%%hvd --out world\nimport os\n"
        "(hvd.rank(), hvd.size(), hvd.local_rank(), globals().get('kept'), os.getpid(), "
        "hvd.allreduce(torch.ones(1), op=hvd.Sum).item())")

# A small model trained with @hvd.elastic.run; every commit that returned is counted.
# ``victim`` (pushed per rank) makes that engine SIGKILL itself at ``KILL_AT``, mid-epoch.
TRAIN = """%%hvd --out result
import os, signal, time
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
X = torch.randn(2048, 16, generator=g)
y = (X @ torch.randn(16, generator=g) > 0).long()
model = torch.nn.Linear(16, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                               named_parameters=model.named_parameters())
state = hvd.elastic.TorchState(model=model, optimizer=opt, step=0)
STEPS, KILL_AT = 60, {kill_at}
done = []  # steps whose commit returned; outside the state, so a restore never rewrites it

@hvd.elastic.run
def train(state):
    while state.step < STEPS:
        if victim and state.step == KILL_AT:
            os.kill(os.getpid(), signal.SIGKILL)
        order = torch.randperm(2048, generator=torch.Generator().manual_seed(state.step))
        idx = order[:256].chunk(hvd.size())[hvd.rank()]
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(X[idx]), y[idx]).backward()
        opt.step()
        state.step += 1
        state.commit()
        done.append(state.step - 1)
        time.sleep(0.05)  # training goes on for seconds after the kill: the cell must wait

train(state)
with torch.no_grad():
    accuracy = (model(X).argmax(1) == y).float().mean().item()
(accuracy, done, hvd.size(), hvd.rank())
"""


@pytest.fixture(scope="module")
def elastic(shell):
    with parked_cluster(shell):
        start_cluster(shell, "-n 2 --launcher local --gpus none")
        yield magics().cluster


def test_scale_errors(run, no_cluster):
    res = run("%hvd_scale -n 2")
    assert res.error is not None and "no hvd cluster is running" in str(res.error)

    class Mpi:
        launcher, ranks, elastic, size = "mpi", [], None, 2
    with pytest.raises(HvdError, match="mpi launcher cannot add or remove single engines.*"
                                       "--launcher local"):
        scale.check(Mpi(), 3, None)
    with pytest.raises(HvdError, match="at least one rank"):
        scale.check(Mpi(), 0, None)
    for line, why in (("-n 2 --min-np 1", "the mpi launcher cannot lose or add single ranks"),
                      ("-n 2 --launcher local --min-np 3", "need 1 <= --min-np <= -n 2")):
        res = run(f"%hvd_start {line}")
        assert res.error is not None and why in str(res.error), res.text
        assert magics().cluster is None  # refused before anything started


def test_start_elastic_from_the_start(run, shell):
    with parked_cluster(shell):
        res = start_cluster(shell, "-n 2 --launcher local --gpus none --no-dashboard --min-np 2")
        assert "the 2 ranks are elastic (generation 1, --min-np 2)" in res.out, res.out
        cluster = magics().cluster
        assert cluster.elastic is not None and cluster.elastic.engines == \
            [r.engine_id for r in cluster.ranks]
        assert run(SHOW).error is None
        assert {v[1] for v in magics().shell.user_ns["world"].values()} == {2}


def test_grow_2_to_4_keeps_state(elastic, run):
    assert run("%%hvd\nkept = 'rank %d' % hvd.rank()").error is None
    before = [r.pid for r in elastic.ranks]
    for bad, why in (("-n 0", "at least one rank"), ("-n 1 --min-np 2", "below --min-np 2")):
        res = run(f"%hvd_scale {bad}")
        assert res.error is not None and why in str(res.error), res.text
    res = run("%hvd_scale -n 4")
    assert res.error is None, res.text
    assert "scaled from 2 to 4 ranks" in res.out
    assert elastic.size == 4 and [r.rank for r in elastic.ranks] == [0, 1, 2, 3]
    # the driver's table (GPU pins of the new ranks follow its local ranks) = the core's
    assert [r.local_rank for r in elastic.ranks] == [0, 1, 2, 3]
    assert [r.pid for r in elastic.ranks[:2]] == before  # the same engines, state kept
    assert run(SHOW).error is None
    world = magics().shell.user_ns["world"]
    assert [world[r][:4] for r in range(4)] == [
        (0, 4, 0, "rank 0"), (1, 4, 1, "rank 1"), (2, 4, 2, None), (3, 4, 3, None)]
    assert {world[r][5] for r in range(4)} == {4.0}
    assert [world[r][4] for r in range(4)] == [r.pid for r in elastic.ranks]


def test_shrink_stops_the_highest_ranks(elastic, run):
    gone = elastic.ranks[3].pid
    res = run("%hvd_scale -n 3")
    assert res.error is None, res.text
    assert elastic.size == 3
    assert run(SHOW).error is None
    world = magics().shell.user_ns["world"]
    assert [world[r][:4] for r in range(3)] == [
        (0, 3, 0, "rank 0"), (1, 3, 1, "rank 1"), (2, 3, 2, None)]
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and _alive(gone):
        time.sleep(0.1)
    assert not _alive(gone)
    res = run("%hvd_scale -n 4")  # back to 4 for the training tests
    assert res.error is None and elastic.size == 4, res.text


def _alive(pid):
    import psutil
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _train(run, victim_rank, kill_at=25):
    for info in magics().cluster.ranks:  # only that engine kills itself, once
        magics().cluster.client[info.engine_id].push({"victim": info.rank == victim_rank},
                                                     block=True)
    return run(TRAIN.replace("{kill_at}", str(kill_at)))


def test_rank_killed_mid_epoch_survivors_go_on(elastic, run):
    assert elastic.size == 4
    plain = _train(run, victim_rank=None)
    assert plain.error is None, plain.text
    base = magics().shell.user_ns["result"]
    assert base[0][1] == list(range(60)) and base[0][2] == 4
    victim = elastic.ranks[3]
    res = _train(run, victim_rank=3)
    assert res.error is None, res.text
    assert "rank 3 died (killed by SIGKILL" in res.out, res.out
    assert "re-formed as generation" in res.out and "%hvd_scale -n 4" in res.out
    result = magics().shell.user_ns["result"]
    survivors = sorted(result)
    assert survivors == [0, 1, 2]
    for r in survivors:
        accuracy, committed, size, rank = result[r]
        assert committed == list(range(60)), committed  # nothing lost, nothing repeated
        assert size == 3
        assert accuracy >= base[0][0] - 0.02 and accuracy > 0.9, (accuracy, base[0][0])
    assert elastic.size == 3 and victim.pid not in [r.pid for r in elastic.ranks]
    assert not elastic.dead_ranks()
    assert run(SHOW).error is None  # the cluster stays usable
    assert {v[1] for v in magics().shell.user_ns["world"].values()} == {3}


def test_dashboard_shows_the_change_and_the_dead_rank(elastic):
    from hvd_magic.widgets.text import render

    model = magics().dashboard.hub.model
    now = time.monotonic()
    world = model.cluster(now).world
    assert world[-1].size_before == 4 and world[-1].size == 3
    ((rank, pid, why),) = world[-1].left
    assert rank == 3 and "SIGKILL" in why
    assert [r.rank for r in model.rows(now)] == [0, 1, 2]
    text = render(model, now)
    assert "4 -> 3 ranks, rank 3 (pid" in text and "killed by SIGKILL" in text


def test_scale_adds_a_replacement(elastic, run):
    res = run("%hvd_scale -n 4")
    assert res.error is None, res.text
    assert run(SHOW).error is None
    world = magics().shell.user_ns["world"]
    assert sorted(v[:3] for v in world.values()) == [(r, 4, r) for r in range(4)]
    assert {v[5] for v in world.values()} == {4.0}


def test_death_below_min_np_fails_the_cell_cleanly(elastic, run):
    res = run("%hvd_scale --min-np 4")
    assert res.error is None, res.text
    t0 = time.monotonic()
    res = _train(run, victim_rank=1, kill_at=5)
    assert isinstance(res.error, RankError), res.text
    text = "\n".join(res.error._render_traceback_())
    assert "fewer than --min-np 4" in text and "%hvd_scale -n 4" in text, text
    assert time.monotonic() - t0 < 60
    res = run("%hvd_scale -n 4 --min-np 1")  # a replacement; the survivors rejoin
    assert res.error is None, res.text
    assert run(SHOW).error is None
    assert {v[1] for v in magics().shell.user_ns["world"].values()} == {4}



def test_death_outside_elastic_run_then_scale_replaces(elastic, run):
    """Code that is not elastic fails on the dead peer as usual; the report says how to
    replace just that rank, and %hvd_scale does (the survivors' failed cores re-form)."""
    assert elastic.size == 4
    for info in elastic.ranks:
        elastic.client[info.engine_id].push({"victim": info.rank == 2, "kept": "x"}, block=True)
    res = run("%%hvd\nimport os, signal\nif victim:\n    os.kill(os.getpid(), signal.SIGKILL)\n"
              "hvd.allreduce(torch.ones(1), name='after.kill')")
    assert isinstance(res.error, RankError), res.text
    text = "\n".join(res.error._render_traceback_())
    assert "rank 2" in text and "%hvd_scale -n 4 starts replacements" in text, text
    res = run("%hvd_scale -n 4")
    assert res.error is None, res.text
    assert run(SHOW).error is None
    world = magics().shell.user_ns["world"]
    assert sorted((v[0], v[1], v[3]) for v in world.values()) == [
        (0, 4, "x"), (1, 4, "x"), (2, 4, "x"), (3, 4, None)]
    assert {v[5] for v in world.values()} == {4.0}


def test_restart_returns_to_a_plain_cluster(elastic, run):
    size = elastic.size
    res = run("%hvd_restart")
    assert res.error is None, res.text
    assert elastic.elastic is None and elastic.size == size
    assert run(SHOW).error is None
    world = magics().shell.user_ns["world"]
    assert sorted(v[:4] for v in world.values()) == [(r, size, r, None) for r in range(size)]
    assert "elastic" not in run("%hvd_status").out
