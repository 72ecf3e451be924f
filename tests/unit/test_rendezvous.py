"""Unit tests for engine_native.rendezvous: the authenticated bootstrap key-value store."""
import logging
import os
import socket
import struct
import threading
import time

import pytest

from engine_native.rendezvous import MAGIC, RendezvousClient, RendezvousError, RendezvousServer

SECRET = b"unit-test-secret"


@pytest.fixture
def server():
    with RendezvousServer(SECRET, handshake_timeout=1.0) as srv:
        yield srv


def _client(srv, secret=SECRET, **kw):
    host, port = srv.address
    return RendezvousClient(f"{host}:{port}", secret, **kw)


def _wait_rejected(srv, count, timeout=10.0):
    """The server counts rejections from its connection threads; wait for them to get there."""
    deadline = time.monotonic() + timeout
    while srv.rejected < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return srv.rejected


def test_set_get_roundtrip(server):
    with _client(server) as c:
        c.set("a", b"1")
        c.set("b", b"")
        c.set("a", b"2" * 1000)  # overwrite
        assert c.get("a", timeout=1) == b"2" * 1000
        assert c.get("b", timeout=1) == b""
        assert c.wait_all(["b", "a"], timeout=1) == [b"", b"2" * 1000]
        assert c.wait_all([], timeout=1) == []
    assert server.keys() == ["a", "b"]


def test_values_are_visible_across_clients_and_binary_safe(server):
    blob = bytes(range(256)) * 64
    with _client(server) as writer, _client(server) as reader:
        writer.set("job/7/rank/0", blob)
        assert reader.get("job/7/rank/0", timeout=1) == blob
        writer.set("ünïcode-κλειδί", b"\x00")
        assert reader.get("ünïcode-κλειδί", timeout=1) == b"\x00"


def test_get_blocks_until_set(server):
    got = {}
    with _client(server) as reader, _client(server) as writer:
        def read():
            got["value"] = reader.get("late", timeout=20)

        t = threading.Thread(target=read)
        t.start()
        t.join(0.2)
        assert t.is_alive(), "get returned before the key was set"
        writer.set("late", b"here")
        t.join(10)
        assert not t.is_alive()
    assert got["value"] == b"here"


def test_wait_all_blocks_until_every_key_is_set(server):
    keys = [f"rank/{i}" for i in range(5)]
    result = {}
    with _client(server) as reader:
        t = threading.Thread(target=lambda: result.update(v=reader.wait_all(keys, timeout=20)))
        t.start()
        writers = [_client(server) for _ in keys]
        for i, w in reversed(list(enumerate(writers))):
            w.set(keys[i], str(i).encode())
        t.join(10)
        for w in writers:
            w.close()
    assert result["v"] == [b"0", b"1", b"2", b"3", b"4"]


def test_get_timeout_names_the_key(server):
    with _client(server) as c:
        start = time.monotonic()
        with pytest.raises(TimeoutError, match="'never-set'"):
            c.get("never-set", timeout=0.3)
        assert 0.25 <= time.monotonic() - start < 5
        c.set("present", b"x")
        with pytest.raises(TimeoutError) as info:
            c.wait_all(["present", "missing-1", "missing-2"], timeout=0.2)
        assert "missing-1" in str(info.value) and "missing-2" in str(info.value)
        assert "'present'" not in str(info.value)
        assert c.get("present", timeout=0) == b"x"  # connection still usable after a timeout


def test_many_concurrent_clients(server):
    n = 32
    errors = []

    def worker(i):
        try:
            with _client(server) as c:
                c.set(f"k{i}", str(i).encode())
                vals = c.wait_all([f"k{j}" for j in range(n)], timeout=20)
                assert vals == [str(j).encode() for j in range(n)]
        except Exception as exc:  # collected and asserted below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert not errors


def test_wrong_secret_is_rejected_and_server_survives(server, caplog):
    caplog.set_level(logging.WARNING, logger="engine_native.rendezvous")
    bad = _client(server, secret=b"not-the-secret", connect_timeout=1)
    with pytest.raises(RendezvousError, match="wrong secret"):
        bad.set("evil", b"1")
    assert _wait_rejected(server, 1) >= 1
    assert any("authentication" in r.getMessage() for r in caplog.records)
    assert "evil" not in server.keys()
    with _client(server) as good:
        good.set("ok", b"1")
        assert good.get("ok", timeout=1) == b"1"


def test_client_rejects_server_without_secret():
    with RendezvousServer(b"other-secret") as impostor:
        with pytest.raises(RendezvousError):
            _client(impostor, connect_timeout=1).get("x", timeout=1)


@pytest.mark.parametrize("payload", [
    b"",                                   # connect and close
    b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",  # wrong protocol, short
    os.urandom(64),                        # right length, random proof
    os.urandom(1 << 16),                   # lots of garbage
], ids=["empty", "http", "random-64", "random-64k"])
def test_garbage_connections_are_dropped(server, payload):
    with socket.create_connection(server.address, timeout=10) as s:
        hello = s.recv(len(MAGIC) + 32, socket.MSG_WAITALL)
        assert hello.startswith(MAGIC)
        if payload:
            try:
                s.sendall(payload)
                assert s.recv(1) == b"", "server kept a connection that sent garbage"
            except ConnectionResetError:
                pass  # dropped while our bytes were still unread: reset instead of EOF
    if len(payload) >= 64:
        assert _wait_rejected(server, 1) >= 1
    with _client(server) as good:
        good.set("after-garbage", b"ok")
        assert good.get("after-garbage", timeout=1) == b"ok"


def test_oversized_and_malformed_frames_after_auth_drop_only_that_connection(server):
    limit = 1 << 20
    with _client(server) as good:
        good.set("big", b"x" * limit)
        with pytest.raises(RendezvousError, match="exceeds"):
            good.set("too-big", b"x" * (limit + 1))
        assert good.get("big", timeout=1) == b"x" * limit
    # An authenticated peer announcing a 4 GiB frame is dropped without allocating it.
    rogue = _client(server)
    sock = rogue._connected().sock
    sock.sendall(struct.pack("!BI", 1, 0xFFFFFFFF))
    assert sock.recv(1) == b""
    rogue.close()
    # Unknown op code in a frame that authenticates (an authenticated but malformed request).
    rogue = _client(server)
    channel = rogue._connected()
    channel.send(99, b"")
    assert channel.sock.recv(1) == b""
    rogue.close()
    with _client(server) as good:
        assert good.get("big", timeout=1) == b"x" * limit


def test_total_store_size_is_bounded():
    with RendezvousServer(SECRET, max_value_bytes=1000, max_total_bytes=4000) as srv:
        with _client(srv) as c:
            for i in range(3):
                c.set(f"k{i}", b"v" * 1000)
            with pytest.raises(RendezvousError, match="store full"):
                c.set("k9", b"v" * 1000)
            c.set("k0", b"w" * 1000)  # overwriting in place still fits
            assert c.get("k0", timeout=1) == b"w" * 1000


def test_stop_wakes_blocked_readers():
    srv = RendezvousServer(SECRET)
    srv.start()
    errors = []
    c = _client(srv)
    c.set("warm", b"1")  # connected before the stop
    t = threading.Thread(target=lambda: errors.append(_catch(lambda: c.get("never", 60))))
    t.start()
    t.join(0.2)
    start = time.monotonic()
    srv.stop()
    t.join(10)
    assert not t.is_alive() and time.monotonic() - start < 10
    assert isinstance(errors[0], (TimeoutError, RendezvousError))
    srv.stop()  # idempotent


def _catch(fn):
    try:
        fn()
    except Exception as exc:  # returned for the assertion
        return exc
    return None


def test_idle_server_uses_no_cpu(server):
    with _client(server) as c:
        c.set("x", b"1")
        t = threading.Thread(target=lambda: _catch(lambda: c.get("never", 1.5)))
        before = os.times()
        t.start()
        t.join(10)
        after = os.times()
    busy = (after.user + after.system) - (before.user + before.system)
    assert busy < 0.3, f"{busy:.2f} s of CPU while one request waited 1.5 s"


def test_argument_validation(server):
    host, port = server.address
    with pytest.raises(ValueError):
        RendezvousServer(b"")
    with pytest.raises(ValueError):
        RendezvousClient("no-port", SECRET)
    with pytest.raises(ValueError):
        RendezvousClient(f"{host}:{port}", b"")
    with _client(server) as c:
        with pytest.raises(ValueError):
            c.set("", b"x")
        with pytest.raises(ValueError):
            c.set("k" * 2000, b"x")
        with pytest.raises(TypeError):
            c.set("k", "not bytes")
        with pytest.raises(ValueError):
            c.get("k", timeout=-1)


def test_unreachable_server_raises_promptly():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, not listening: connections are refused
        start = time.monotonic()
        with pytest.raises(RendezvousError, match="cannot reach"):
            RendezvousClient(f"127.0.0.1:{port}", SECRET, connect_timeout=0.5).get("k", 1)
        assert time.monotonic() - start < 5


def test_a_swallowed_reply_fails_the_request_instead_of_blocking(server):
    # A path that takes the request and never answers (a proxy swallowing the store's frames)
    # fails every request after reply_timeout, set included; get's own wait comes first.
    from mitm_proxy import S2C, TamperingProxy

    handshake = ([32 + 32], [8 + 32, 32])
    with TamperingProxy(server.address, handshake,
                        lambda conn, direction, seq, f: [] if direction == S2C else [f]) as proxy:
        client = RendezvousClient(proxy.address, SECRET, connect_timeout=5, reply_timeout=0.5)
        with client:
            began = time.monotonic()
            with pytest.raises(RendezvousError, match="connection lost"):
                client.set("k", b"v")
            with pytest.raises(RendezvousError, match="connection lost"):
                client.get("k", timeout=0.2)
            assert time.monotonic() - began < 10
