"""A private asyncio loop on a daemon thread, for ipyparallel's ``Cluster`` coroutines.

``Cluster.*_sync`` runs its coroutine on a throw-away loop when no loop is running (plain
IPython) and on a hidden thread otherwise (a kernel), so launcher callbacks such as "engine
exited with code -9" are lost in the first case. Running every Cluster call on one long-lived
loop thread makes launchers deliver their stop callbacks the same way everywhere.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading


class LoopThread:
    """Owns one event loop running forever on a daemon thread."""

    def __init__(self, name: str = "hvd-cluster-loop"):
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, coro, timeout: float | None = None):
        """Run ``coro`` on the loop and wait for its result (Ctrl-C interrupts the wait)."""
        future = asyncio.run_coroutine_threadsafe(coro, self.loop)
        try:
            return future.result(timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"timed out after {timeout} s") from None
        except BaseException:
            if not future.done():
                future.cancel()
            raise

    def call(self, fn, *args, timeout: float = 2):
        """``fn(*args)`` on the loop's thread, and its result: ipyparallel's launchers change
        their dicts (``launchers``, ``stop_data``, ``outputs``) in the loop's callbacks, so a
        reader on another thread could see one change size mid-iteration (a start's error once
        read only "dictionary changed size during iteration"). Run here instead on the loop's
        own thread, once the loop has stopped, or when it is held past ``timeout`` (a
        launcher's join blocks it after a stop timed out); then a read that met a change is
        tried again."""
        if self.loop.is_running() and threading.current_thread() is not self._thread:
            async def on_loop():
                return fn(*args)
            try:
                return self.run(on_loop(), timeout)
            except TimeoutError:
                pass
        for attempt in range(10):
            try:
                return fn(*args)
            except RuntimeError as exc:  # "dictionary changed size during iteration"
                if "changed size" not in str(exc) or attempt == 9:
                    raise

    def close(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(2)
