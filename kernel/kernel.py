"""The hvd cluster kernel: an ipykernel ``IPythonKernel`` whose cells run on all ranks.

:class:`HvdKernel` is the driver of a cluster, like a notebook that ran ``%load_ext hvd_magic``.
It only decides where a cell runs (:func:`hvd_magic.kernel.routing.route`) and then lets IPython
run it: a ranks cell becomes a ``%%hvd`` cell, so streaming, collapsing, error reports,
``--timeout``, interrupts and recovery are the magics' own (hvd_magic.cellrun), and the cell is
awaited (comm messages such as the dashboard's Stop are handled while it runs).

Protocol for a ranks cell:

A. no cluster yet: ``%hvd_start`` runs first in the same cell, with the size and launcher of
   the kernelspec (:func:`hvd_magic.kernel.kernelspec.start_line`); its progress and status
   are the cell's first output; if it fails, the cell fails with its error;
B. requests still running on the ranks (a slow completion on rank 0, a status or recovery
   query that timed out on a loaded machine) get up to ``SETTLE_LIMIT`` s to end, so the cell
   does not find those ranks "busy" (a rank truly stuck is then reported by ``%%hvd``);
C. IPython runs ``%%hvd [options]\\n<cell>``; rank 0's last expression is ``Out[n]``.

Silent requests (frontends' and tools' probes, never notebook cells) run in the driver as
they are.

Interrupts: the kernelspec uses ``interrupt_mode: signal``; Jupyter SIGINTs the kernel's
process group, which holds neither the engines nor mpiexec (ipyparallel starts them in their
own session), and the running ``%%hvd`` cell turns the SIGINT into its interrupt protocol.
Shutdown and restart stop the cluster (``%hvd_stop``, on the control thread); if Jupyter kills
the kernel before that ends, hvd_magic's reaper stops what is left.
"""

from __future__ import annotations

import asyncio
import os
import time

from ipykernel.ipkernel import IPythonKernel
from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, magics_class

from . import remote, routing
from .kernelspec import DISPLAY_NAME, start_line

ENV_QUERY_TIMEOUT = "HVD_KERNEL_QUERY_TIMEOUT"  # s to wait for rank 0's completions (default 5)
SETTLE_LIMIT = 10.0  # s a ranks cell waits for earlier requests still running on the ranks


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("hvd-magic")
    except PackageNotFoundError:
        return "0"


def _query_timeout() -> float:
    try:
        return max(0.1, float(os.environ.get(ENV_QUERY_TIMEOUT, "") or 5.0))
    except ValueError:
        return 5.0


@magics_class
class KernelMagics(Magics):
    """Magics that only the hvd cluster kernel has."""

    @cell_magic
    def local(self, line, cell):
        """Run the cell in the kernel itself (the driver), not on the ranks.

        In the hvd cluster kernel every cell runs on all ranks; ``%%local`` keeps one in the
        notebook's own Python: plotting, moving data with ``%hvd_push`` / ``%hvd_pull``,
        anything that must not run N times. Cells of line magics only (``%hvd_status``) and
        cells starting with ``%hvd_...`` run here without it.

        Examples
        --------
        ::

            In [3]: %%local
               ...: import os
               ...: lr = 0.01 * 4
               ...: os.getpid()
            Out[3]: 41230

            In [4]: %hvd_push lr
            hvd: pushed lr to all ranks
        """
        self.shell.ex(cell)


class HvdKernel(IPythonKernel):
    """Jupyter kernel in which every cell runs on all ranks of an hvd cluster."""

    implementation = "hvd_cluster"
    implementation_version = _version()

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        try:
            self.shell.extension_manager.load_extension("hvd_magic")
        except Exception as exc:  # the first ranks cell shows it again; never a dead kernel
            self.log.error("hvd kernel: %%load_ext hvd_magic failed: %s", exc)
        self.shell.register_magics(KernelMagics)
        self.rank0 = remote.RankZero(_query_timeout())

    @property
    def banner(self):
        try:
            how = f"%hvd_start {start_line()}"
        except ValueError as exc:
            how = str(exc)
        return (super().banner or "") + (
            f"\n{DISPLAY_NAME}: every cell runs on all ranks; the first one starts the cluster "
            f"({how}).\n%%local runs a cell in this kernel; %hvd_status shows the ranks.\n")

    @property
    def kernel_info(self):
        """No debugger: it would step through the driver, never through the ranks' code."""
        info = super().kernel_info
        info["supported_features"] = [f for f in info.get("supported_features", [])
                                      if f != "debugger"]
        return info

    # -- the cluster ---------------------------------------------------------------------------

    def _magics(self):
        return self.shell.magics_manager.registry.get("HvdMagics")

    def _cluster(self):
        return getattr(self._magics(), "cluster", None)

    async def _start_cluster(self, run, store_history: bool):
        """Step A: start the cluster in the running cell; returns the failed reply, or None."""
        if self._magics() is None:
            reply = await run("%load_ext hvd_magic", store_history=False)
            if reply["status"] != "ok":
                return self._count(reply, store_history)
        try:
            args = start_line()
        except ValueError as exc:
            self.shell.show_usage_error(UsageError(str(exc)))
            return self._count({"status": "error", "ename": "UsageError", "evalue": str(exc),
                                "traceback": [], "user_expressions": {}, "payload": []},
                               store_history)
        reply = await run(f"%hvd_start {args}", store_history=False)
        return None if reply["status"] == "ok" else self._count(reply, store_history)

    def _count(self, reply: dict, store_history: bool) -> dict:
        """A cell answered without IPython counting it gets its execution count anyway."""
        if store_history:
            self.shell.execution_count += 1
        reply["execution_count"] = self.shell.execution_count - 1
        return reply

    async def _settle(self, limit: float) -> None:
        """Step B: wait (awaiting, never blocking) until no earlier request is outstanding."""
        cluster, deadline = self._cluster(), time.monotonic() + limit
        while time.monotonic() < deadline and (
                self.rank0.busy() or (cluster is not None and cluster.busy_ranks())):
            await asyncio.sleep(0.05)

    def _stop_cluster(self) -> None:
        if self._cluster() is None:
            return
        try:
            self.shell.run_line_magic("hvd_stop", "")
        except Exception as exc:
            self.log.warning("hvd kernel: stopping the cluster: %s", exc)

    # -- requests ------------------------------------------------------------------------------

    async def do_execute(self, code, silent, store_history=True, user_expressions=None,
                         allow_stdin=False, *, cell_meta=None, cell_id=None):
        parent = super()

        async def run(text, store_history=store_history):
            return await parent.do_execute(text, silent, store_history, user_expressions,
                                           allow_stdin, cell_meta=cell_meta, cell_id=cell_id)

        if silent:  # frontends' and tools' own probes: the driver, never a cluster start
            return await run(code)
        r = routing.route(code)
        if r.where == routing.RANKS:
            if self._cluster() is None:
                failed = await self._start_cluster(run, store_history)
                if failed is not None:
                    return failed
            await self._settle(SETTLE_LIMIT)
        elif r.where == routing.HELP and await self._page_from_rank0(r):
            return self._count(await run("", store_history=False), store_history)
        return await run(r.code)

    async def _page_from_rank0(self, r: routing.Route) -> bool:
        """``obj?`` on a ranks kernel: rank 0's answer as the pager payload."""
        reply = await self.rank0.ask(self._cluster(), remote.inspect_at, r.name, len(r.name),
                                     r.detail)
        if not reply or not reply.get("found"):
            return False
        self.shell.payload_manager.write_payload({"source": "page", "data": reply["data"],
                                                  "start": 0})
        return True

    async def do_complete(self, code, cursor_pos):
        cursor_pos = len(code) if cursor_pos is None else cursor_pos
        r = routing.route(code)
        if cursor_pos >= r.body_offset and r.where in (routing.RANKS, routing.LOCAL):
            if r.where == routing.RANKS:
                reply = await self.rank0.ask(self._cluster(), remote.complete, r.body,
                                             cursor_pos - r.body_offset)
            else:
                reply = super().do_complete(r.body, cursor_pos - r.body_offset)
            if reply is not None:
                return remote.shift_completion(reply, r.body_offset)
        return super().do_complete(code, cursor_pos)

    async def do_inspect(self, code, cursor_pos, detail_level=0, omit_sections=()):
        r = routing.route(code)
        if cursor_pos >= r.body_offset and r.where in (routing.RANKS, routing.LOCAL):
            at = cursor_pos - r.body_offset
            if r.where == routing.RANKS:
                reply = await self.rank0.ask(self._cluster(), remote.inspect_at, r.body, at,
                                             detail_level, list(omit_sections))
            else:
                reply = super().do_inspect(r.body, at, detail_level, omit_sections)
            if reply is not None:
                return reply
        return super().do_inspect(code, cursor_pos, detail_level, omit_sections)

    async def do_shutdown(self, restart):
        self._stop_cluster()
        return super().do_shutdown(restart)


def launch(argv=None) -> None:
    """Run the kernel (what the kernelspec's ``python -m hvd_magic.kernel -f ...`` does)."""
    from ipykernel.kernelapp import IPKernelApp

    IPKernelApp.launch_instance(argv=argv, kernel_class=HvdKernel)


__all__ = ["HvdKernel", "KernelMagics", "launch"]
