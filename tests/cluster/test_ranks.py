"""--ranks parsing and rank-set formatting (hvd_magic.ranks)."""

import pytest

from hvd_magic.ranks import format_ranks, parse_ranks, rank_label

pytestmark = pytest.mark.timeout(30)


@pytest.mark.parametrize("spec,expected", [
    (None, [0, 1, 2, 3]), ("all", [0, 1, 2, 3]), ("2", [2]), ("0,3", [0, 3]), ("1-3", [1, 2, 3]),
    ("::2", [0, 2]), ("1:3", [1, 2]), ("-1", [3]), ("0, 2-3", [0, 2, 3]),
])
def test_parse_ranks(spec, expected):
    assert parse_ranks(spec, 4) == expected


@pytest.mark.parametrize("spec,message", [
    ("4", "out of range"), ("a", "is not a rank"), ("3-1", "is empty"), ("5:", "selects no rank"),
])
def test_parse_ranks_errors_name_the_problem(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_ranks(spec, 4)


def test_format_and_label():
    assert format_ranks([3, 0, 1, 2, 7, 9]) == "0-3,7,9"
    assert format_ranks([0, 1]) == "0,1"
    assert rank_label([0, 1, 2], [0, 1, 2]) == "all ranks"
    assert rank_label([1], [0, 1]) == "rank 1"
    assert rank_label([0, 2], [0, 1, 2]) == "ranks 0,2"
