"""The elastic driver's host bookkeeping (hvd_magic.launch.elastic_hosts): discovery output,
Horovod's blacklist rule, and who gets which rank in the next generation."""
import pytest

from hvd_magic.launch.elastic_hosts import DiscoveryError, HostBook, Worker, parse_discovery


def test_parse_discovery_slots_and_errors():
    assert parse_discovery("localhost:2\n# comment\n\n127.0.0.2\n", 3) == {
        "localhost": 2, "127.0.0.2": 3}
    with pytest.raises(DiscoveryError, match="pass --slots-per-host"):
        parse_discovery("localhost\n", None)
    with pytest.raises(DiscoveryError, match="expected host or host:slots"):
        parse_discovery("localhost:0\n", None)
    # another machine is a host like any other (its workers start over ssh)
    assert parse_discovery("203.0.113.9:2\nnode7\n", 1) == {"203.0.113.9": 2, "node7": 1}


def _workers(book, n_per_host):
    plan = book.plan([], max_np=99)
    workers = [Worker(f"{h}[{s}]", h, s, rank=r) for r, (h, s) in enumerate(plan.start)]
    assert len(workers) == n_per_host * len(book.slots)
    return workers


def test_failed_host_is_blacklisted_with_its_other_workers():
    book = HostBook(slots={"a": 2, "b": 2})
    workers = _workers(book, 2)
    workers[2].running = False          # b[0] died
    book.failed(workers[2])
    plan = book.plan(workers, max_np=4)
    assert [w.wid for w in plan.ranked] == ["a[0]", "a[1]"]
    assert [w.wid for w in plan.stop] == ["b[1]"] and plan.start == []


def test_single_host_retires_only_the_failed_slot_and_survivors_keep_order():
    book = HostBook(slots={"localhost": 4}, blacklisting=False)
    workers = _workers(book, 4)
    workers[0].running = False          # rank 0 died: the lowest survivor becomes rank 0
    book.failed(workers[0])
    plan = book.plan(workers, max_np=4)
    assert [w.wid for w in plan.ranked] == ["localhost[1]", "localhost[2]", "localhost[3]"]
    assert plan.start == [] and plan.stop == []


def test_added_host_fills_up_to_max_np_after_the_survivors():
    book = HostBook(slots={"a": 2})
    workers = _workers(book, 2)
    assert book.update({"a": 2, "b": 2}) and not book.update({"a": 2, "b": 2})
    plan = book.plan(workers, max_np=3)
    assert [w.wid for w in plan.ranked] == ["a[0]", "a[1]"] and plan.start == [("b", 0)]


def test_removed_host_stops_its_workers():
    book = HostBook(slots={"a": 1, "b": 1})
    workers = _workers(book, 1)
    book.update({"b": 1})
    plan = book.plan(workers, max_np=4)
    assert [w.wid for w in plan.ranked] == ["b[0]"] and [w.wid for w in plan.stop] == ["a[0]"]
