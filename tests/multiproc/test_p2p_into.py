"""A receive given out= (Note [Receive into out] in engine_native/csrc/runtime/peer_ops_into.cc):
a message that arrives for a posted receive of its dtype and shape is written into out itself
(the core's result has no Buffer of its own: no copy in between), two posted receives of one
tag each get their own message in order, one whose out does not fit gets a copy; a receive into
out that times out in the middle of its message never writes out again, and the message goes to
the next receive whole.
"""
import os

import numpy as np

from multiproc import checks, faults
from multiproc.harness import run_ranks

LARGE = 12 << 20  # bytes: three times the 4 MiB ring of a directed pair


def _post(src, tag, out):
    """A receive into `out` through the core; its handle."""
    from engine_native import _core, _dtypes
    return _core.p2p_recv(src, tag, False, -1, False, out,
                          _dtypes.numpy_code(out.dtype, "recv", "out"), out.shape)


def _landed(handle, out) -> tuple:
    """(written in out itself, the values received) of a receive posted with _post."""
    from engine_native import _core, _dtypes
    buffer, shape, code = _core.wait(handle)
    array = out if buffer is None else \
        np.frombuffer(buffer, dtype=_dtypes.numpy_dtype(code)).reshape(shape)
    return buffer is None, array.tolist() if array.size < 10 else float(array.sum())


def posted_suite():
    hvd = checks.init("shm")
    large = np.arange(LARGE // 4, dtype=np.float32) % 7
    if hvd.rank() == 0:
        hvd.barrier()  # rank 1 posted every receive
        hvd.send(large, 1, tag=1)
        hvd.send(np.array([1, 2, 3], np.int16), 1, tag=7)
        hvd.send(np.array([4, 5, 6], np.int16), 1, tag=7)
        hvd.send(np.full(5, 2.5), 1, tag=9)
        # last: a misfit, refused (Note [Refused messages]), which would fail a later send
        hvd.send(np.ones(3, np.float32), 1, tag=8)
        hvd.barrier()
        hvd.shutdown()
        return None
    outs = {"large": np.zeros_like(large), "first": np.zeros(3, np.int16),
            "second": np.zeros(3, np.int16), "short": np.zeros(4, np.float32)}
    handles = {"large": _post(0, 1, outs["large"]), "first": _post(0, 7, outs["first"]),
               "second": _post(0, 7, outs["second"]), "short": _post(0, 8, outs["short"])}
    out9 = np.zeros(5)
    request = hvd.irecv(0, tag=9, out=out9)  # the public API: out itself comes back
    hvd.barrier()
    seen = {name: _landed(h, outs[name]) for name, h in handles.items()}
    seen["api"] = request.wait() is out9 and out9.tolist()
    seen["large equal"] = bool(np.array_equal(outs["large"], large))
    hvd.barrier()
    hvd.shutdown()
    return seen


def test_a_posted_receive_is_written_into_out():
    _, seen = (r.value for r in run_ranks(posted_suite, 2, timeout=60))
    total = float((np.arange(LARGE // 4, dtype=np.float32) % 7).sum())
    assert seen == {"large": (True, total), "first": (True, [1, 2, 3]),
                    "second": (True, [4, 5, 6]), "short": (False, [1.0, 1.0, 1.0]),
                    "api": [2.5] * 5, "large equal": True}, seen


PAUSE_AT = 1 << 20  # bytes the sender writes before it stalls


def stalled_suite(folder):
    """The sender's channel stalls after PAUSE_AT bytes while the pause file exists (the test
    switch PEER_PAUSE_AT_BYTES): the receive into out has part of the message and times out
    (HVD_TIMEOUT=2 on the receiver); then the file goes and the sender goes on."""
    hvd = checks.init("shm")
    message = (np.arange(LARGE // 4, dtype=np.float32) % 251) + 1  # no zero anywhere
    if hvd.rank() == 0:
        return faults.send_once_posted(hvd, folder, [message])
    error, out = faults.failed_receive_into(hvd, folder, message)
    written = int(np.count_nonzero(out))
    kept = out.copy()
    os.remove(os.path.join(folder, "pause"))
    got = hvd.recv(0, tag=3)  # the whole message, in memory of its own
    hvd.barrier()
    hvd.shutdown()
    return (error, 0 < written < out.size, bool(np.array_equal(out, kept)),
            bool(np.array_equal(got, message)))


def test_a_receive_into_out_that_times_out_mid_message_leaves_out_alone(tmp_path):
    pause = tmp_path / "pause"
    pause.write_text("")
    # The ring's path (the pause switch stalls ring writes): no split copy (Note [Split copy])
    res = run_ranks(stalled_suite, 2, args=(str(tmp_path),), timeout=60,
                    env={"HVD_P2P_SPLIT_MIN_BYTES": "0"},
                    rank_env={0: {"HVD_TEST_PEER_PAUSE_AT_BYTES": str(PAUSE_AT),
                                  "HVD_TEST_PEER_PAUSE_FILE": str(pause)},
                              1: {"HVD_TIMEOUT": "2"}})
    assert res[0].value == "sent"
    error, partly, untouched_after, whole = res[1].value
    assert error and "recv from rank 0 (tag 3): no byte came from that rank for 2 s" in error
    assert partly and untouched_after and whole, res[1].value
