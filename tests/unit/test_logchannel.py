"""The Spark log channel (hvd_magic.spark.logchannel) delivers a rank's lines and exit code only
from frames that authenticate: a man in the middle (tests/unit/mitm_proxy.py) between a real
LogClient and a real LogServer alters, replays, swaps and injects frames after an honest
handshake. Nothing it touched reaches the driver, the driver logs what happened and reports the
rank's connection closed, the task's next sends fail with a clear error, and the driver keeps
taking honest tasks.
"""
import os
import threading

import pytest

from hvd_magic.spark.logchannel import EXIT, MAGIC, STDERR, STDOUT, LogClient, LogServer
from mitm_proxy import C2S, TamperingProxy, frame, old_protocol_server, split

SECRET = b"log-channel-secret"
HANDSHAKE = ([4 + 32 + 32], [8 + 32, 32])  # rank + client nonce + proof; magic + nonce, proof
RANK = 3
pytestmark = pytest.mark.timeout(60)


class Driver:
    """A LogServer and what it delivered, per rank; ``closed[rank]`` is set on "closed"."""

    def __init__(self):
        self.messages, self.closed, self._lock = {}, {}, threading.Lock()
        self.server = LogServer(SECRET, self._on_message)
        self.address = "%s:%d" % self.server.address

    def _on_message(self, rank, kind, text):
        with self._lock:
            self.messages.setdefault(rank, []).append((kind, text))
            event = self.closed.setdefault(rank, threading.Event())
        if kind == "closed":
            event.set()

    def wait_closed(self, rank):
        with self._lock:
            event = self.closed.setdefault(rank, threading.Event())
        assert event.wait(20), f"rank {rank}'s connection was not closed"
        return self.messages[rank]


@pytest.fixture
def driver():
    d = Driver()
    yield d
    d.server.stop()


def _flip(data):
    b = bytearray(data)
    b[len(b) - 33] ^= 0x01  # the last byte of the body
    return bytes(b)


def _assert_still_serving(driver):
    with LogClient(driver.address, SECRET, rank=9, connect_timeout=5) as honest:
        honest.send(STDOUT, "fresh")
    assert driver.wait_closed(9) == [("stdout", "fresh"), ("closed", "")]


def _assert_task_learns_it(task, proxy):
    assert proxy.closed[0].wait(20)
    with pytest.raises(ConnectionError, match="spark log channel .* closed the connection"):
        for _ in range(1000):  # the first send after the close may still be buffered
            task.send(STDOUT, "after the close")


def _attack(driver, tamper, lines):
    with TamperingProxy(driver.server.address, HANDSHAKE, tamper) as proxy:
        with LogClient(proxy.address, SECRET, rank=RANK, connect_timeout=5) as task:
            for kind, text in lines:
                task.send(kind, text)
            delivered = driver.wait_closed(RANK)
            _assert_task_learns_it(task, proxy)
    return delivered


def _auth_failures(caplog):
    return [r.getMessage() for r in caplog.records if "failed authentication" in r.getMessage()]


def test_altered_line_is_not_delivered(driver, caplog):
    def tamper(conn, direction, seq, data):
        return [_flip(data) if seq == 1 else data]

    delivered = _attack(driver, tamper, [(STDOUT, "loss 0.5"), (STDOUT, "loss 0.4")])
    assert delivered == [("stdout", "loss 0.5"), ("closed", "")]
    [line] = _auth_failures(caplog)
    assert line.startswith(f"spark log channel: frame 1 from rank {RANK} (")
    assert line.endswith("failed authentication (altered, replayed or out of order); "
                         "connection closed")
    _assert_still_serving(driver)


def test_replayed_line_is_not_delivered_twice(driver, caplog):
    first = []

    def tamper(conn, direction, seq, data):
        first.append(data)
        return [first[0]] if seq == 1 else [data]

    delivered = _attack(driver, tamper, [(STDOUT, "epoch 1"), (STDOUT, "epoch 2")])
    assert delivered == [("stdout", "epoch 1"), ("closed", "")]
    assert "frame 1 from rank" in _auth_failures(caplog)[0]
    _assert_still_serving(driver)


def test_swapped_lines_are_not_delivered(driver, caplog):
    held = []

    def tamper(conn, direction, seq, data):
        if seq == 0:
            held.append(data)
            return []
        return [data, held[0]] if seq == 1 else [data]

    delivered = _attack(driver, tamper, [(STDOUT, "first"), (STDOUT, "second")])
    assert delivered == [("closed", "")]
    assert "frame 0 from rank" in _auth_failures(caplog)[0]
    _assert_still_serving(driver)


def test_dropped_line_is_noticed_at_the_next_frame(driver, caplog):
    def tamper(conn, direction, seq, data):
        return [] if seq == 1 else [data]  # "epoch 2 failed" never arrives

    delivered = _attack(driver, tamper, [(STDOUT, "epoch 1"), (STDERR, "epoch 2 failed"),
                                         (EXIT, "0")])
    assert delivered == [("stdout", "epoch 1"), ("closed", "")]
    assert "frame 1 from rank" in _auth_failures(caplog)[0]
    _assert_still_serving(driver)


def test_injected_exit_code_is_not_acted_on(driver, caplog):
    forged = frame(EXIT, b"0", os.urandom(32))  # "rank 3 finished fine"

    def tamper(conn, direction, seq, data):
        return [forged, data] if direction == C2S and seq == 0 else [data]

    delivered = _attack(driver, tamper, [(STDOUT, "Traceback ..."), (EXIT, "1")])
    assert delivered == [("closed", "")]
    assert "frame 0 from rank" in _auth_failures(caplog)[0]
    _assert_still_serving(driver)


def test_honest_stream_through_the_relay_is_delivered_in_order(driver):
    def tamper(conn, direction, seq, data):
        assert split(data)[0] in (STDOUT, EXIT)
        return [data]

    with TamperingProxy(driver.server.address, HANDSHAKE, tamper) as proxy:
        with LogClient(proxy.address, SECRET, rank=RANK, connect_timeout=5) as task:
            for i in range(50):
                task.send(STDOUT, f"line {i}")
            task.send(EXIT, "0")
        delivered = driver.wait_closed(RANK)  # before the relay goes
    assert delivered == [("stdout", f"line {i}") for i in range(50)] + [("exit", "0"),
                                                                        ("closed", "")]


def test_other_protocol_version_fails_at_the_handshake_by_name():
    assert MAGIC == b"HVDLOG2\0"
    with old_protocol_server(b"HVDLOG1\0") as old_driver, \
            pytest.raises(ConnectionError, match="speaks HVDLOG1, this task HVDLOG2"):
        LogClient(old_driver, SECRET, rank=0, connect_timeout=5)
