"""The one-round board (Note [One round] in engine_native/csrc/runtime/one_round.cc) on ranks of
several hosts: each rank's post reaches the ranks off its shared-memory segment as a frame over
the point-to-point channel (TCP). The one-host tests' suites and checks run unchanged, their
ranks placed on fake hosts (HVD_HOSTNAME per rank), "AAB" meaning ranks 0 and 1 on host A and
rank 2 on host B: every small blocking op takes the board with the reference's values,
mismatches and what the board does not take are negotiated (owed ops too), join closes and
reopens it, a rank that dies or fails is named, the stall warning names the rank held back;
also over TCP forced on one host. A rank asking for no board still turns it off for all, on
any host.

Each rank checks at init that it is where the test placed it (local rank and size, shm to the
peers of its host and tcp to the others: checks.init's "hosts:" expectation, which overrides
the suite's own through EXPECT_TRANSPORT), so a case cannot pass on one host by mistake.
"""
import pytest

from multiproc import checks
from multiproc import test_one_round as one_host
from multiproc import test_one_round_failure as failure
from multiproc import test_one_round_stall as stall
from multiproc.harness import run_ranks


def _placement(hosts: str, tcp: bool = False) -> dict:
    """run_ranks keyword arguments putting rank r on fake host ``hosts[r]`` (over TCP alone
    with ``tcp``), each rank checking its place at init."""
    env = {"EXPECT_TRANSPORT": "hosts:" + ",".join(hosts)}
    if tcp:
        env["HVD_TRANSPORT"] = "tcp"
    return {"env": env, "hosts": [f"host{h}" for h in hosts]}


def _on_hosts(monkeypatch, module, hosts: str, tcp: bool = False) -> list:
    """Make ``module``'s tests start their ranks on ``hosts`` (their own env, rank_env and
    timeout kept); returns the names of the suites run, filled as they run."""
    real, runs = module.run_ranks, []

    def placed(fn, np, env=None, timeout=60, **kwargs):
        assert np == len(hosts), f"{fn.__name__} runs {np} ranks, placed on {hosts}"
        where = _placement(hosts, tcp)
        runs.append(fn.__name__)
        return real(fn, np, env={**(env or {}), **where["env"]}, timeout=timeout,
                    hosts=where["hosts"], **kwargs)
    monkeypatch.setattr(module, "run_ranks", placed)
    return runs


def _cases(test) -> list:
    """The parameters of a one-host test (its pytest.mark.parametrize): the same cases here."""
    marks = [m for m in getattr(test, "pytestmark", []) if m.name == "parametrize"]
    assert len(marks) == 1, test.__name__
    return marks[0].args


# the values of every dtype, op, scale and root (the one-host test runs 3 ranks on one host)
@pytest.mark.parametrize("hosts,tcp", [("AB", False), ("AAB", False), ("AABBC", False),
                                       ("AAA", True)],
                         ids=["AB", "AAB", "AABBC", "AAA-tcp"])
def test_small_blocking_ops_take_the_board_across_hosts_with_the_reference_values(hosts, tcp):
    for r in run_ranks(one_host.values_suite, len(hosts), timeout=120, **_placement(hosts, tcp)):
        assert r.value["bad"] == [], (r.rank, r.value["bad"][:10])
        assert r.value["counted"] == r.value["ops"], (r.rank, r.value)


# async, large, process set, group negotiated; other orders and owed ops; mismatches an error
# on every rank; the board again after them and after a join
@pytest.mark.parametrize("hosts", ["AAB", "ABB"])
def test_routes_and_owed_ops_across_hosts(monkeypatch, hosts):
    runs = _on_hosts(monkeypatch, one_host, hosts)
    one_host.test_what_the_board_does_not_take_is_negotiated_and_orders_may_differ()
    assert runs == ["routes_suite"]


@pytest.mark.parametrize("hosts", ["AB", "ABA", "AABBC"])
def test_the_board_reopens_after_every_join_across_hosts(monkeypatch, hosts):
    runs = _on_hosts(monkeypatch, one_host, hosts)
    one_host.test_the_board_reopens_after_every_join(len(hosts))
    assert runs == ["join_cycles_suite"]


def test_an_op_negotiated_after_the_join_is_not_waited_for_across_hosts(monkeypatch, tmp_path):
    runs = _on_hosts(monkeypatch, one_host, "AB")
    one_host.test_an_op_negotiated_after_the_join_is_not_waited_for_on_the_reopened_board(
        tmp_path)
    assert runs == ["second_thread_suite"]


def test_a_rank_that_dies_on_another_host_fails_the_others(monkeypatch, tmp_path):
    runs = _on_hosts(monkeypatch, one_host, "AB")
    one_host.test_a_rank_that_dies_while_the_others_wait_on_its_post_fails_them(tmp_path)
    assert runs == ["dying_suite"]


# rule I across hosts (Note [One round] K): before a failure judges the pending round, a rank
# reads the posts still coming from ranks that have not answered it (they sent them before
# failing themselves), so a round every rank answered finishes everywhere, as on one host.
# Rank 0, alone on host A, is held off the round; rank 1 on host B (beside rank 2) fails after
# it returned there: every survivor finishes the op with the reference value, and the next op
# fails with the cause.
FAILURE_TEST = failure.test_a_failure_after_every_rank_answered_a_round_finishes_it_first


@pytest.mark.parametrize(*_cases(FAILURE_TEST))
def test_a_failure_across_hosts_finishes_a_round_every_rank_answered(tmp_path, how, cause,
                                                                     failing):
    where = _placement("ABB")
    results = run_ranks(failure.failure_suite, failure.NP, args=(how, str(tmp_path)),
                        timeout=60, env={"HVD_TIMEOUT": "10", **where["env"]},
                        hosts=where["hosts"], check=False,
                        rank_env={0: {"HVD_TEST_ONE_ROUND_HOLD": "allreduce." + failure.HELD}})
    for rank in range(failure.NP):
        if how == "exit" and rank == failing:
            continue
        value = results[rank].value
        assert isinstance(value, dict), (rank, results[rank])
        assert value["got"] == failure.EXPECTED, (rank, value)
        assert value["board_ops"] == 2, (rank, value)  # "before" and the held op
        assert value["after"].startswith("HorovodInternalError") and cause in value["after"], \
            (rank, value)


def test_the_stall_warning_names_the_rank_held_back_on_another_host(monkeypatch):
    runs = _on_hosts(monkeypatch, stall, "AB")
    stall.test_a_rank_held_back_from_the_board_is_named_by_the_stall_warning()
    assert runs == ["board_stall_suite"]


@pytest.mark.parametrize("kwargs", [
    _placement("AA", tcp=True), checks.world_kwargs(2, "tcp", env={"EXPECT_TRANSPORT": "tcp"})],
    ids=["one host", "a host per rank"])
def test_the_board_is_on_over_forced_tcp(kwargs):
    for r in run_ranks(one_host.count_suite, 2, timeout=60, **kwargs):
        assert r.value["got"] == [[1] * 3] * 20 + [[1] * 2], r.value
        assert r.value["counted"] == 21, (r.rank, r.value)  # every op took the board


# any rank's wish, on any host, is the world's: the board stays off for every rank
@pytest.mark.parametrize("rank_env", [{2: {"HVD_ONE_ROUND_BYTES": "0"}},
                                      {0: {"HVD_ONE_ROUND_BYTES": "0"}},
                                      {2: {"HVD_STALL_SHUTDOWN_TIME": "30"}}],
                         ids=["none on B", "none on A", "deadlock shutdown on B"])
def test_the_board_is_off_for_every_host_when_one_rank_asks_for_none(rank_env):
    for r in run_ranks(one_host.count_suite, 3, timeout=60, rank_env=rank_env,
                       **_placement("AAB")):
        assert r.value["got"] == [[3] * 3] * 20 + [[2] * 2], r.value
        assert r.value["counted"] == 0, (r.rank, r.value)
