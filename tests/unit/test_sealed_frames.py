"""Every frame on the rendezvous store's connection is authenticated, not only the connection:
a man in the middle (tests/unit/mitm_proxy.py) between a real RendezvousClient and a real
RendezvousServer alters, replays, swaps and injects frames after an honest handshake. Nothing
it touched is stored, returned or unpickled; the client fails promptly with a clear error;
the server logs what happened and keeps serving honest clients.
"""
import os
import pickle
import socket
import struct
import threading

import pytest

from engine_native.rendezvous import RendezvousClient, RendezvousError, RendezvousServer
from engine_native.rendezvous_wire import OK, OP_SET, pack_key
from engine_native.sealed_frames import FrameAuthError, SealedChannel
from mitm_proxy import C2S, S2C, TamperingProxy, frame, old_protocol_server, split

SECRET = b"sealed-frames-secret"
HANDSHAKE = ([32 + 32], [8 + 32, 32])  # client nonce + proof; magic + server nonce, proof
pytestmark = pytest.mark.timeout(60)


def _write_marker(path):
    with open(path, "w") as f:
        f.write("unpickled")


class Bomb:
    """Unpickling this writes a marker file: proof that a payload reached pickle.loads."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return _write_marker, (self.path,)


def _set_request(key, value):
    return pack_key(key) + value


def _ok_reply(value):
    return struct.pack("!I", len(value)) + value


def _flip(frame_bytes):
    b = bytearray(frame_bytes)
    b[len(b) - 33] ^= 0x01  # the last byte of the body
    return bytes(b)


@pytest.fixture
def server():
    with RendezvousServer(SECRET, handshake_timeout=5.0) as srv:
        yield srv


def _direct(srv):
    return RendezvousClient("%s:%d" % srv.address, SECRET, connect_timeout=5)


def _assert_still_serving(srv):
    with _direct(srv) as honest:
        honest.set("fresh", b"ok")
        assert honest.get("fresh", timeout=5) == b"ok"


def _auth_failures(caplog):
    return [r.getMessage() for r in caplog.records if "failed authentication" in r.getMessage()]


def test_altered_request_is_not_stored(server, caplog):
    def tamper(conn, direction, seq, data):
        return [_flip(data)] if direction == C2S else [data]

    with TamperingProxy(server.address, HANDSHAKE, tamper) as proxy:
        with RendezvousClient(proxy.address, SECRET, connect_timeout=5) as victim:
            with pytest.raises(RendezvousError, match="connection lost"):
                victim.set("job/payload", b"honest value")
    assert server.keys() == []
    [line] = _auth_failures(caplog)
    assert line.startswith("rendezvous: frame 0 from 127.0.0.1:")
    assert "(altered, replayed or out of order); connection closed" in line
    _assert_still_serving(server)


def test_altered_reply_is_not_returned_or_unpickled(server, tmp_path):
    marker = tmp_path / "marker"
    with _direct(server) as launcher:
        launcher.set("job/payload", pickle.dumps({"fn": "honest"}))

    def tamper(conn, direction, seq, data):
        if direction == S2C:
            status, _, tag = split(data)
            return [frame(status, _ok_reply(pickle.dumps(Bomb(str(marker)))), tag)]
        return [data]

    with TamperingProxy(server.address, HANDSHAKE, tamper) as proxy:
        with RendezvousClient(proxy.address, SECRET, connect_timeout=5) as rank:
            with pytest.raises(RendezvousError, match=r"reply frame 0 failed authentication"
                                                      r".*check HVD_RENDEZVOUS"):
                pickle.loads(rank.get("job/payload", timeout=5))
    assert not marker.exists()
    _assert_still_serving(server)


def test_replayed_request_does_not_roll_a_value_back(server, caplog):
    sent = []

    def tamper(conn, direction, seq, data):
        if direction == C2S:
            sent.append(data)
            if seq == 2:  # before the get, replay set("k", b"old")
                return [sent[0], data]
        return [data]

    with TamperingProxy(server.address, HANDSHAKE, tamper) as proxy:
        with RendezvousClient(proxy.address, SECRET, connect_timeout=5) as victim:
            victim.set("k", b"old")
            victim.set("k", b"new")
            with pytest.raises(RendezvousError):
                victim.get("k", timeout=5)
    with _direct(server) as honest:
        assert honest.get("k", timeout=5) == b"new"
    [line] = _auth_failures(caplog)
    assert line.startswith("rendezvous: frame 2 from ")
    _assert_still_serving(server)


def test_replayed_reply_is_not_returned(server):
    with _direct(server) as launcher:
        launcher.set("rank0/addr", b"10.0.0.1:4000")
        launcher.set("rank1/addr", b"10.0.0.2:4000")
    replies = []

    def tamper(conn, direction, seq, data):
        if direction == S2C:
            replies.append(data)
            return [replies[0]]  # every reply is the first one again
        return [data]

    with TamperingProxy(server.address, HANDSHAKE, tamper) as proxy:
        with RendezvousClient(proxy.address, SECRET, connect_timeout=5) as rank:
            assert rank.get("rank0/addr", timeout=5) == b"10.0.0.1:4000"
            with pytest.raises(RendezvousError, match="reply frame 1 failed authentication"):
                rank.get("rank1/addr", timeout=5)
    _assert_still_serving(server)


def test_frames_swapped_between_connections_are_refused(server, caplog):
    # The client waits for each reply, so one connection never has two frames in flight; the
    # swap a per-connection key must stop is two ranks' first frames exchanged.
    held, cond = {}, threading.Condition()

    def tamper(conn, direction, seq, data):
        if direction == C2S and seq == 0:
            with cond:
                held[conn] = data
                cond.notify_all()
                assert cond.wait_for(lambda: len(held) == 2, timeout=20)
            return [held[1 - conn]]
        return [data]

    errors = []

    def rank(i):
        with RendezvousClient(proxy.address, SECRET, connect_timeout=5) as c:
            try:
                c.set(f"rank{i}/addr", b"10.0.0.%d:4000" % i)
            except RendezvousError as exc:
                errors.append(exc)

    with TamperingProxy(server.address, HANDSHAKE, tamper) as proxy:
        threads = [threading.Thread(target=rank, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert len(errors) == 2
    assert server.keys() == []
    assert len(_auth_failures(caplog)) == 2
    _assert_still_serving(server)


def test_injected_request_is_not_stored(server, tmp_path, caplog):
    forged = frame(OP_SET, _set_request("job/payload", pickle.dumps(Bomb(str(tmp_path / "m")))),
                   os.urandom(32))

    def tamper(conn, direction, seq, data):
        return [forged, data] if direction == C2S and seq == 0 else [data]

    with TamperingProxy(server.address, HANDSHAKE, tamper) as proxy:
        with RendezvousClient(proxy.address, SECRET, connect_timeout=5) as victim:
            with pytest.raises(RendezvousError):
                victim.set("rank0/addr", b"10.0.0.1:4000")
    assert server.keys() == []
    assert _auth_failures(caplog)[0].startswith("rendezvous: frame 0 from ")
    with _direct(server) as honest, pytest.raises(TimeoutError):
        honest.get("job/payload", timeout=0)
    _assert_still_serving(server)


def test_injected_reply_is_not_returned_or_unpickled(server, tmp_path):
    marker = tmp_path / "marker"
    with _direct(server) as launcher:
        launcher.set("job/payload", pickle.dumps("honest"))
    forged = frame(OK, _ok_reply(pickle.dumps(Bomb(str(marker)))), bytes(32))

    def tamper(conn, direction, seq, data):
        return [forged, data] if direction == S2C else [data]

    with TamperingProxy(server.address, HANDSHAKE, tamper) as proxy:
        with RendezvousClient(proxy.address, SECRET, connect_timeout=5) as rank:
            with pytest.raises(RendezvousError, match="reply frame 0 failed authentication"):
                pickle.loads(rank.get("job/payload", timeout=5))
    assert not marker.exists()
    _assert_still_serving(server)


# -- the channel itself, without a store --------------------------------------------------------
def _pair(context_a=b"t", context_b=b"t"):
    a, b = socket.socketpair()
    nonces = (os.urandom(32), os.urandom(32))
    return (SealedChannel(a, SECRET, *nonces, is_server=False, context=context_a),
            SealedChannel(b, SECRET, *nonces, is_server=True, context=context_b))


def test_channel_round_trip_and_sequence():
    client, server = _pair()
    with client.sock, server.sock:
        for i in range(3):
            client.send(i, b"body %d" % i)
            assert server.recv(1 << 10) == (i, b"body %d" % i)
            server.send(7, b"")
            assert client.recv(0) == (7, b"")
        assert server.received == client.received == 3


def test_reflected_frame_and_other_protocol_are_refused():
    client, server = _pair()
    with client.sock, server.sock:
        client.send(1, b"x")
        server.sock.sendall(server.sock.recv(1 << 10))  # echo the client's own frame back
        with pytest.raises(FrameAuthError, match="frame 0 failed authentication"):
            client.recv(1 << 10)
    client, server = _pair(b"rendezvous", b"log")
    with client.sock, server.sock:
        client.send(1, b"x")
        with pytest.raises(FrameAuthError):
            server.recv(1 << 10)


def test_length_is_checked_before_the_body_is_read():
    client, server = _pair()
    with client.sock, server.sock:
        client.sock.sendall(struct.pack("!BI", 1, 1 << 30))  # no body follows
        with pytest.raises(ValueError, match="exceeds the limit"):
            server.recv(1 << 20)


def test_older_protocol_version_fails_at_the_handshake_by_name():
    with old_protocol_server(b"HVDRDV1\0") as old_server, \
            pytest.raises(RendezvousError, match="speaks protocol HVDRDV1, this client HVDRDV2"
                                                 ".*same version"):
        RendezvousClient(old_server, SECRET, connect_timeout=5).get("x", 1)
