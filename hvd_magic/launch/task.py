"""``python -m hvd_magic.launch.task``: one rank of :func:`hvd_magic.run` (and of HorovodRunner
and the Spark runner, which use the same rank side).

0. Pin this rank's GPU (hvd_magic.gpu_pinning.pin_this_rank, from HVD_LOCAL_RANK/SIZE) before
   anything can touch CUDA; a rank whose launcher pinned it keeps that pin.
A. Read the cloudpickled ``(fn, args, kwargs)`` from the launcher's store (``HVD_RUN_STORE``,
   authenticated with ``HVD_SECRET``, key ``HVD_RUN_KEY/payload``).
B. Call it. The rank initialises the core itself (``hvd.init()`` inside ``fn``), as with
   horovod.run.
C. Store ``{"ok": True, "value": ...}`` or the error (type, message, traceback without this
   file's frames, the exception itself when it pickles) under ``HVD_RUN_KEY/result/<rank>``.
D. Exit 0, or on an error abort the core and exit 1 at once (no graceful shutdown waiting for
   peers), so the launcher's fail-fast rule and the peers both see the failure immediately.
"""

from __future__ import annotations

import os
import sys
import traceback

_RANK_VARS = ("HVD_RANK", "PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def _rank() -> int:
    for name in _RANK_VARS:
        value = os.environ.get(name)
        if value is not None and value.isdigit():
            return int(value)
    return 0


def _error(stage: str, exc: BaseException, skip_frames: int = 1) -> dict:
    tb = exc.__traceback__
    for _ in range(skip_frames):
        if tb is not None and tb.tb_next is not None:
            tb = tb.tb_next
    text = "".join(traceback.format_exception(type(exc), exc, tb))
    try:
        import cloudpickle
        pickled = cloudpickle.dumps(exc)
    except Exception:
        pickled = None
    return {"ok": False, "stage": stage, "type": type(exc).__name__,
            "module": type(exc).__module__, "message": str(exc), "traceback": text,
            "exception": pickled}


def _encode(result: dict, rank: int) -> bytes:
    from .pickling import UnpicklableError, dumps
    try:
        return dumps(result, what=f"rank {rank}'s return value", root="the return value")
    except UnpicklableError as exc:
        err = {"ok": False, "stage": "result", "type": "UnpicklableError",
               "module": __name__, "message": str(exc), "traceback": "", "exception": None}
        return dumps(err, what="error report")


def main() -> int:
    from engine_native.rendezvous import RendezvousClient

    from ..gpu_pinning import pin_this_rank

    rank = _rank()
    pin_this_rank()  # step 0
    key = os.environ["HVD_RUN_KEY"]
    timeout = float(os.environ.get("HVD_START_TIMEOUT", "60"))
    client = RendezvousClient(os.environ["HVD_RUN_STORE"], bytes.fromhex(os.environ["HVD_SECRET"]),
                              connect_timeout=timeout)
    try:
        from .pickling import loads_call
        fn, args, kwargs = loads_call(client.get(f"{key}/payload", timeout=timeout))
    except Exception as exc:
        result = _error("load", exc, skip_frames=1)
    else:
        client.close()  # idle while fn runs; reconnects lazily for the result
        try:
            result = {"ok": True, "value": fn(*args, **kwargs)}
        except SystemExit as exc:
            if exc.code in (None, 0):
                result = {"ok": True, "value": None}
            else:
                result = _error("call", exc)
        except BaseException as exc:  # KeyboardInterrupt too: report it, then exit non-zero
            result = _error("call", exc)
    sys.stdout.flush()
    sys.stderr.flush()
    client.set(f"{key}/result/{rank}", _encode(result, rank))
    client.close()
    if not result["ok"]:
        _fail_fast(f"rank {rank} raised {result['type']}: {result['message']}"[:500])
    return 0


def _fail_fast(reason: str) -> None:
    """Leave at once on an error: abort the core (peers blocked in a collective fail now,
    naming this rank) instead of the graceful shutdown at exit, which waits for them."""
    basics = sys.modules.get("engine_native.basics")
    try:
        if basics is not None and basics.is_initialized():
            basics.abort(reason)
    except Exception:
        pass
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(1)


if __name__ == "__main__":
    sys.exit(main())
