"""algo/peer_block.h: the check each single-copy read (broadcast, allgather, alltoall) makes on
what a peer published before reading it (issue #20 review 2). The numbers come from another
process, so the tests give the ones no live peer does: an offset near 2**64 (``at + want`` would
wrap to a small number and pass), a block size that disagrees with what this rank expects."""
import pytest
from native.build_testhooks import load

_hooks = load()  # the test-only extension (tests/native): built here if needed
U64 = 2**64


def check(input_bytes, at, published, want, op="alltoall"):
    _hooks.check_peer_block(op, 2, input_bytes, at, published, want)


@pytest.mark.parametrize("input_bytes,at,want", [
    (100, 0, 100), (100, 40, 60), (100, 100, 0), (0, 0, 0), (U64 - 1, U64 - 2, 1)])
def test_blocks_inside_the_input_pass(input_bytes, at, want):
    check(input_bytes, at, want, want)


@pytest.mark.parametrize("input_bytes,at,want", [
    (100, 41, 60),           # one byte past the end
    (100, 101, 0),           # an offset past the end, even for an empty block
    (100, U64 - 10, 20),     # at + want wraps around to 10 <= 100
    (100, 10, U64 - 5),      # and the other way round
    (U64 - 1, 1, U64 - 1),   # both huge
])
def test_blocks_outside_the_input_are_refused_without_overflow(input_bytes, at, want):
    with pytest.raises(RuntimeError, match=r"local rank 2 published a block of .* lies outside"):
        check(input_bytes, at, want, want)


def test_a_size_that_disagrees_names_both_sizes():
    with pytest.raises(RuntimeError, match=r"single-copy alltoall: local rank 2 published 48 "
                                           r"bytes for this rank, which expects 64"):
        check(1000, 0, 48, 64)
    with pytest.raises(RuntimeError, match=r"single-copy broadcast: .* published 65 bytes"):
        check(65, 0, 65, 64, op="broadcast")
