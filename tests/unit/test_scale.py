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
