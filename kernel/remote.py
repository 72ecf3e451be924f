"""Completion and inspection answered from rank 0's namespace.

Engine side: :func:`complete` and :func:`inspect_at` run on rank 0 through ``view.apply`` and
reuse the engine's own ipykernel (``do_complete`` / ``do_inspect``), so Tab and Shift-Tab answer
exactly as a plain IPython kernel holding rank 0's variables would. Keep them free of
driver-side imports: ipyparallel re-imports this module on the engine.

Driver side: :class:`RankZero` sends one query at a time, only while rank 0 is idle (a query
queued behind a running cell would make that rank look busy to the next cell), and waits for
it without blocking the kernel's event loop. Main thread of the kernel.
"""

from __future__ import annotations

import asyncio
import inspect


def _shell():
    from IPython import get_ipython
    return get_ipython()


def _engine_kernel_call(method: str, *args):
    """``shell.kernel.<method>(*args)`` when the engine's kernel answers synchronously."""
    kernel = getattr(_shell(), "kernel", None)
    handler = getattr(kernel, method, None)
    if handler is None:
        return None
    reply = handler(*args)
    if inspect.isawaitable(reply):  # an async kernel: use the fallback below instead
        getattr(reply, "close", lambda: None)()
        return None
    return reply


def complete(code: str, cursor_pos: int) -> dict:
    """A ``complete_reply`` content for ``code`` with the cursor at ``cursor_pos``."""
    reply = _engine_kernel_call("do_complete", code, cursor_pos)
    if reply is not None:
        return reply
    from IPython.utils.tokenutil import line_at_cursor

    line, offset = line_at_cursor(code, cursor_pos)
    text, matches = _shell().complete("", line, cursor_pos - offset)
    return {"matches": matches, "cursor_start": cursor_pos - len(text),
            "cursor_end": cursor_pos, "metadata": {}, "status": "ok"}


def inspect_at(code: str, cursor_pos: int, detail_level: int = 0,
               omit_sections=()) -> dict:
    """An ``inspect_reply`` content for the name at ``cursor_pos`` in ``code``."""
    reply = _engine_kernel_call("do_inspect", code, cursor_pos, detail_level,
                                tuple(omit_sections))
    if reply is not None:
        return reply
    from IPython.utils.tokenutil import token_at_cursor

    try:
        data = _shell().object_inspect_mime(token_at_cursor(code, cursor_pos),
                                            detail_level=detail_level)
    except KeyError:
        return {"status": "ok", "found": False, "data": {}, "metadata": {}}
    return {"status": "ok", "found": True, "data": data, "metadata": {}}


def shift_completion(reply: dict, offset: int) -> dict:
    """A completion reply for a cell body, moved to positions in the whole cell."""
    if not offset:
        return reply
    reply = dict(reply)
    for key in ("cursor_start", "cursor_end"):
        if isinstance(reply.get(key), int):
            reply[key] += offset
    meta = dict(reply.get("metadata") or {})
    for key, items in meta.items():
        if isinstance(items, list) and all(isinstance(i, dict) for i in items):
            meta[key] = [{**i, **{k: i[k] + offset for k in ("start", "end")
                                  if isinstance(i.get(k), int)}} for i in items]
    reply["metadata"] = meta
    return reply


class RankZero:
    """Driver side: ask rank 0, one query at a time, never behind a running cell.

    Parameters
    ----------
    timeout : float
        Seconds to wait for an answer before the caller falls back to the driver's namespace.
    """

    def __init__(self, timeout: float):
        self.timeout = timeout
        self._pending = None  # the AsyncResult of the last query

    @staticmethod
    def _idle(cluster) -> bool:
        if cluster is None or not cluster.ranks or cluster.client is None:
            return False
        return 0 not in cluster.dead_ranks() and 0 not in cluster.busy_ranks()

    async def ask(self, cluster, func, *args):
        """``func(*args)`` on rank 0, or None (no cluster, rank 0 busy or dead, an error, or
        no answer within ``timeout``)."""
        if self.busy() or not self._idle(cluster):
            return None
        try:
            self._pending = cluster.view([0]).apply_async(func, *args)
            done, _ = await asyncio.wait({asyncio.wrap_future(self._pending)},
                                         timeout=self.timeout)
            return done.pop().result()[0] if done else None
        except Exception:  # a remote error or a cluster going away: answer locally
            return None

    def busy(self) -> bool:
        """Whether the last query is still running on rank 0."""
        return self._pending is not None and not self._pending.done()
