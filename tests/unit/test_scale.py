"""hvd_magic.scale without a cluster: which GPU a rank added by %hvd_scale is pinned for."""
from hvd_magic.rankinfo import RankInfo
from hvd_magic.scale import assign_pin_slots


def rank(r, host, slot=None):
    return RankInfo(rank=r, engine_id=10 + r, host=host, pid=100 + r, pin_slot=slot)


def test_a_replacement_takes_the_dead_ranks_gpu():
    # host a had slots 0-3; the rank on slot 1 died, the survivors were renumbered 0-2
    ranks = [rank(0, "a", 0), rank(1, "a", 2), rank(2, "a", 3), rank(3, "a")]
    assign_pin_slots(ranks)
    assert [r.pin_slot for r in ranks] == [0, 2, 3, 1]


def test_new_ranks_fill_free_slots_per_host_then_extend():
    ranks = [rank(0, "a", 0), rank(1, "b", 0), rank(2, "a"), rank(3, "b"), rank(4, "b")]
    assign_pin_slots(ranks)
    assert [r.pin_slot for r in ranks] == [0, 0, 1, 1, 2]


def test_elastic_start_never_gets_mps():
    """Note [MPS by default]: under MPS a fatal GPU error in one rank reaches every rank of
    that GPU, so an elastic cluster gets no daemon, and --mps with --min-np is refused."""
    import argparse

    import pytest
    from IPython.core.error import UsageError

    from hvd_magic.scalemagics import check_start_elastic

    args = argparse.Namespace(min_np=1, n=2, launcher="local", mps="auto")
    check_start_elastic(args)
    assert args.mps == "off"
    with pytest.raises(UsageError, match="--mps is not supported for elastic clusters"):
        check_start_elastic(argparse.Namespace(min_np=1, n=2, launcher="local", mps="on"))
    fixed = argparse.Namespace(min_np=None, n=2, launcher="local", mps="auto")
    check_start_elastic(fixed)
    assert fixed.mps == "auto", "a fixed-size cluster keeps the default"
