"""Horovod's ``groups`` rule (engine_native/group_split.py), shared by the TensorFlow and Keras
bindings: the split alone, on plain objects standing for variables."""
from engine_native.group_split import index_groups, split_evenly


def test_an_int_splits_into_consecutive_groups_differing_by_at_most_one():
    assert split_evenly(list(range(7)), 3) == [[0, 1, 2], [3, 4], [5, 6]]
    assert split_evenly([0, 1], 4) == [[0], [1]]  # empty groups dropped
    assert index_groups(2, [0, 2, 3], {}) == [[0, 2], [3]]  # positions without a gradient skipped


def test_none_is_one_group_of_every_present_gradient():
    assert index_groups(None, [1, 3], {}) == [[1, 3]]
    assert index_groups(None, [], {}) == []


def test_lists_keep_their_order_and_unlisted_gradients_go_alone():
    a, b, c, d, stranger = (object() for _ in range(5))
    position = {id(v): i for i, v in enumerate([a, b, c, d])}
    groups = [[c, a], [stranger, d]]
    assert index_groups(groups, [0, 1, 2, 3], position) == [[2, 0], [3], [1]]
    # d has no gradient this step: its group is empty and dropped
    assert index_groups(groups, [0, 1, 2], position) == [[2, 0], [1]]
