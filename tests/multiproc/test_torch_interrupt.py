"""Ctrl-C on engine_native.torch's Python path (runtime.synchronize, the handle map of Note
[Handle lifetime]), on spawned ranks: a KeyboardInterrupt while waiting leaves the op pending
in the core, so the tensors it reads and writes stay alive with no reference left in the
caller, and the same handle finishes once the other rank submits. (The allreduce C path has
the same check in test_torch_allreduce_path.py.)"""
import gc
import signal
import weakref

import pytest
import torch

from multiproc import checks
from multiproc.harness import run_ranks


class _TimeLimit(Exception):
    """What a signal-based time limit raises (pytest-timeout's signal method, a user's
    SIGALRM handler): an ordinary Exception, unlike KeyboardInterrupt."""


def _interrupt_in(seconds, error=KeyboardInterrupt):
    """``error`` raised in this thread after ``seconds`` by a signal handler (KeyboardInterrupt:
    what Ctrl-C does to a script)."""
    def handler(signum, frame):
        raise error
    signal.signal(signal.SIGALRM, handler)
    signal.setitimer(signal.ITIMER_REAL, seconds)


def interrupted_wait(error_name):
    import engine_native.torch as hvd
    from engine_native import _core
    from engine_native.torch import runtime

    hvd.init()
    me = hvd.rank()
    oob = checks.out_of_band()
    bcast = torch.full((1024,), me + 1.0)   # broadcast in place: the core writes into it
    gather = torch.full((3,), float(me))    # allgather: the core reads it
    alive = {"broadcast": weakref.ref(bcast), "allgather": weakref.ref(gather)}
    if me == 1:  # submits only after rank 0 was interrupted: rank 0's ops stay pending
        oob.get("interrupted", timeout=60)
        hvd.broadcast_(bcast, root_rank=1, name="late.b")
        hvd.allgather(gather, name="late.g")
        oob.close()
        hvd.shutdown()
        return None
    hb = hvd.broadcast_async_(bcast, root_rank=1, name="late.b")
    hg = hvd.allgather_async(gather, name="late.g")
    assert hb in runtime._handle_map and not _core.torch_kept(hb), "not the Python path"
    error = {"KeyboardInterrupt": KeyboardInterrupt, "_TimeLimit": _TimeLimit}[error_name]
    _interrupt_in(0.2, error)
    try:
        hvd.synchronize(hb)
        raise AssertionError("synchronize returned before rank 1 submitted")
    except error:
        pass
    del bcast, gather
    gc.collect()
    kept = {name: ref() is not None for name, ref in alive.items()}
    oob.set("interrupted", b"1")
    out = hvd.synchronize(hb)  # the same handle, after the interrupt
    gathered = hvd.synchronize(hg)
    result = {"kept": kept, "in_place": out is alive["broadcast"](),
              "broadcast": sorted(set(out.tolist())), "allgather": gathered.tolist()}
    del out
    gc.collect()
    result["released"] = {name: ref() is None for name, ref in alive.items()}
    oob.close()
    hvd.shutdown()
    return result


@pytest.mark.parametrize("error_name", ["KeyboardInterrupt", "_TimeLimit"])
def test_ctrl_c_while_waiting_keeps_the_python_paths_tensors_alive(error_name):
    """Ctrl-C, or any exception a signal handler raises: the op stays pending, not failed."""
    res = run_ranks(interrupted_wait, 2, args=(error_name,), timeout=90)
    got = res[0].value
    assert got["kept"] == {"broadcast": True, "allgather": True}, "pending tensors let go"
    assert got["in_place"] and got["broadcast"] == [2.0], got  # rank 1's values, in place
    assert got["allgather"] == [0.0, 0.0, 0.0, 1.0, 1.0, 1.0], got
    assert got["released"] == {"broadcast": True, "allgather": True}, "held after synchronize"
