"""Code that runs on the engines (ranks), shipped by reference through ``view.apply``.

The magics call these functions on every engine; ipyparallel pickles them by module name, so
this module must import on an engine with nothing but the standard library, IPython (which
every engine has) and, lazily, torch / engine_native. Keep it free of driver-side imports.

State per engine process: ``RANK`` (set by :func:`init_engine`) and the name of the core API
module in use. The user's namespace gets ``hvd`` and its framework (``torch``, ``jax``, ...).
"""

from __future__ import annotations

import importlib
import os
import pickle
import signal
import socket
import sys
import threading
import time

from . import frameworks, gpu_pinning

RANK: int | None = None
_CORE_MODULE: str | None = None  # the binding in use: "engine_native.torch", ".jax", ...


def _shell():
    from IPython import get_ipython
    return get_ipython()


def describe() -> dict:
    """Who and where this engine is, before any rank is assigned."""
    mpi = sys.modules.get("mpi4py.MPI")
    info = {"host": socket.gethostname(), "pid": os.getpid(), "python": sys.executable,
            "mpi_rank": None, "mpi_size": None}
    if mpi is not None and mpi.Is_initialized():
        info["mpi_rank"] = mpi.COMM_WORLD.Get_rank()
        info["mpi_size"] = mpi.COMM_WORLD.Get_size()
        info["mpi_library"] = mpi.Get_library_version().splitlines()[0].strip()
    return info


def init_engine(rank: int, env: dict, gpus: str, local_rank: int, with_core: bool = True,
                local_size: int | None = None, framework: str = "torch") -> dict:
    """Become ``rank``: set the environment, pin a GPU, initialise the core, fill the namespace.

    The GPU is pinned first, before any framework is imported, through
    :func:`hvd_magic.gpu_pinning.pin` (``engine_native.gpu.pin_gpu``: nvidia-smi, never
    ``torch.cuda``), so a CPU-only engine never initialises CUDA. ``local_size`` (ranks on this
    host) tells pin_gpu when ranks share GPUs; unknown, it counts this rank as the last one.
    ``framework`` (hvd_magic.frameworks) names the binding the namespace gets as ``hvd`` and
    the modules it gets beside it (``torch``; ``jax``, ``jnp``, ``optax``; ``keras``; ``tf``).

    Returns what happened (device, the pin as ``gpu``, core API, the core's own rank/size, or
    why it failed); never raises, so one bad rank does not hide the others' reports.
    """
    global RANK, _CORE_MODULE
    RANK = rank
    os.environ.update(env)
    ns = _shell().user_ns
    out: dict = {"rank": rank, "device": "cpu", "core": None, "core_error": None}
    out.update(_pin_gpu(gpus, local_rank, local_size or local_rank + 1))
    chosen = frameworks.FRAMEWORKS[framework]
    for alias, module_name in chosen.namespace:
        module = _import(module_name)
        if module is not None:
            ns[alias] = module
    if not with_core:
        return out
    try:
        hvd = importlib.import_module(chosen.binding)
        hvd.init()
    except BaseException as exc:  # ImportError, core failure, KeyboardInterrupt from the magic
        out["core_error"] = f"{type(exc).__name__}: {exc}"
        return out
    _CORE_MODULE = chosen.binding
    ns["hvd"] = hvd
    out.update(core=chosen.binding, core_rank=hvd.rank(), core_size=hvd.size(),
               local_rank=hvd.local_rank(), cpu_binding=_cpu_binding())
    return out


def _cpu_binding() -> str:
    """The CPUs the core bound this rank to at init ("" unbound: HVD_CPU_BIND)."""
    try:
        return str(importlib.import_module("engine_native").metrics().get("cpu_binding") or "")
    except Exception:  # noqa: BLE001 - a report only; the core itself initialised
        return ""


def _import(name: str):
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def _pin_gpu(gpus: str, local_rank: int, local_size: int) -> dict:
    """One GPU per local rank (round robin when local ranks outnumber GPUs); see gpu_pinning."""
    pin = gpu_pinning.pin(local_rank, local_size, gpus)
    name = pin.get("name") or ""
    if pin.get("gpu_index") is not None:  # narrowed, every rank's GPU is cuda:0: say which
        name = f"GPU {pin['gpu_index']}: {name}".rstrip(": ")
    out = {"device": pin["device"], "gpu": pin, "device_name": name}
    if pin["device"] == "cpu" and pin.get("reason", "").startswith("GPU pinning failed"):
        out["device_name"] = pin["reason"]
    if pin.get("memory_bytes"):
        out["device_memory"] = int(pin["memory_bytes"])
    return out


def _basics():
    return sys.modules.get("engine_native.basics") if _CORE_MODULE else None


# Note [Late interrupts]: the magic interrupts every rank whose answer it has not seen yet; the
# rank's nanny delivers the SIGINT a moment later. A rank whose cell had just ended is by then
# sending its answer, or serving the magic's next request (core_state, reset_core), and an
# interrupt there loses that answer: the magic would then see the rank as "still running an
# earlier cell that ignored the interrupt". So an engine ignores SIGINT once a cell's code has
# run and for the whole of a service request. ipykernel gives the engine its idle handler (which
# ignores SIGINT too) back after every request, and installs the interrupting one before the
# next: a cell's code is always interruptible.
def _ignore_late_interrupts() -> None:
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def core_state() -> dict:
    """The core's state for reports: initialised, pending collectives, current op, last error,
    the CPUs the rank is bound to ("" unbound: HVD_CPU_BIND)."""
    _ignore_late_interrupts()
    basics = _basics()
    if basics is None:
        return {"core": None}
    try:
        if not basics.is_initialized():
            return {"core": _CORE_MODULE, "initialized": False}
        m = basics.metrics()
    except Exception as exc:
        return {"core": _CORE_MODULE, "error": f"{type(exc).__name__}: {exc}"}
    return {"core": _CORE_MODULE, "initialized": True, "pending": list(m.get("pending") or []),
            "current": m.get("current"), "last_error": m.get("last_error", ""),
            "blocked_seconds": float(m.get("main_blocked_seconds") or 0.0),
            "cpu_binding": m.get("cpu_binding", ""), "activity": _pipeline_activity()}


def _pipeline_activity() -> str | None:
    """What a pipeline step on this rank was doing (engine_native/pipeline/activity.py), if
    one was imported at all."""
    module = sys.modules.get("engine_native.pipeline.activity")
    return module.current() if module is not None else None


def reset_core(reason: str) -> dict:
    """Abort everything in flight, then shut down and initialise again (every rank calls this
    at the same time; both steps agree with the other ranks). Returns the new core state."""
    _ignore_late_interrupts()
    basics = _basics()
    if basics is None:
        return {"core": None}
    hvd = sys.modules[_CORE_MODULE]
    t0 = time.perf_counter()
    try:
        basics.abort(reason)
    except Exception:  # not initialised, or already failed: shutdown below still cleans up
        pass
    try:
        hvd.shutdown()
        hvd.init()
    except BaseException as exc:
        return {"core": _CORE_MODULE, "initialized": False,
                "error": f"{type(exc).__name__}: {exc}"}
    return {"core": _CORE_MODULE, "initialized": basics.is_initialized(),
            "optimizers_reset": _reset_optimizers(), "seconds": time.perf_counter() - t0}


def _reset_optimizers() -> int:
    """``reset()`` every live DistributedOptimizer (plain or Adasum): its in-flight gradient
    handles belong to the aborted core epoch, and a stale one makes the next ``zero_grad()``
    raise."""
    registry = sys.modules.get("engine_native.torch.optimizer_registry")
    return registry.reset_all() if registry is not None else 0


def set_rank(rank: int) -> None:
    """The driver renumbered the ranks (an elastic world re-formed, hvd_magic.elastic)."""
    global RANK
    _ignore_late_interrupts()
    RANK = rank


def rejoin(env: dict) -> dict:
    """Leave the current world and join the newest elastic generation (``%hvd_scale``):
    the core restarts, the namespace stays. ``env`` makes ``hvd.init()`` elastic (the first
    time) and names the generation. Returns the core's new rank, size and local rank."""
    global RANK
    _ignore_late_interrupts()
    os.environ.update(env)
    basics = _basics()
    if basics is None:
        return {"core": None, "error": "the core is not running on this engine"}
    hvd = sys.modules[_CORE_MODULE]
    try:
        if basics.is_initialized():
            hvd.shutdown()
        hvd.init()
    except BaseException as exc:
        return {"core": _CORE_MODULE, "error": f"{type(exc).__name__}: {exc}"}
    RANK = hvd.rank()
    return {"core": _CORE_MODULE, "core_rank": hvd.rank(), "core_size": hvd.size(),
            "local_rank": hvd.local_rank(), "optimizers_reset": _reset_optimizers()}


def shutdown_core() -> None:
    _ignore_late_interrupts()
    basics = _basics()
    if basics is not None and basics.is_initialized():
        sys.modules[_CORE_MODULE].shutdown()


class RemoteRepr:
    """Stands for a cell value that could not be pickled: shows the engine's repr."""

    def __init__(self, text: str, type_name: str):
        self.text, self.type_name = text, type_name

    def __repr__(self) -> str:
        return self.text


_PLAIN = (type(None), bool, int, float, complex, str, bytes)


def _portable(value):
    if isinstance(value, _PLAIN) or type(value).__module__.split(".")[0] in ("numpy", "torch"):
        return value
    try:
        pickle.dumps(value)
        return value
    except Exception:
        return RemoteRepr(repr(value)[:20000], type(value).__name__)


class _Watch:
    """While a cell runs, publish the core's pending collectives every ``INTERVAL`` seconds
    (``publish_data``, tagged with the running request), so the driver can see that a rank is
    stuck without interrupting it. One daemon thread per engine, started with the first cell;
    it polls a flag (4 wake-ups a second, nothing else while idle) because waking a thread at
    every cell start cost a GIL switch (~10 ms on a loaded machine) on every cell. It
    publishes only while something is pending, labelled with the cell's token so a late
    publication never passes for the next cell's, with the op the core is executing and how
    long the main thread has been blocked in a wait (Note [Blocked main thread] in the core's
    runtime/metrics.h): what the driver needs to end a cell that can never finish."""

    INTERVAL = 0.25

    def __init__(self):
        self.token = None  # the running cell's token; None between cells
        threading.Thread(target=self._run, name="hvd-cell-watch", daemon=True).start()

    def _run(self):
        from ipyparallel.datapub import publish_data
        last = None
        while True:
            time.sleep(self.INTERVAL)
            token = self.token
            if token is None:
                last = None
                continue
            state = core_state()
            pending = state.get("pending") or []
            if pending or last:
                publish_data({"hvd_core": {
                    "pending": pending, "cell": token, "current": state.get("current"),
                    "blocked_seconds": state.get("blocked_seconds", 0.0)}})
            last = pending


_watch: _Watch | None = None


def run_cell(code: str, value_ranks, token: str = "") -> dict:
    """Run a cell through this engine's IPython (magics, history, display hook all work).

    Returns ``{"status": "ok", "value": ...}`` (the last expression's value, only when this
    rank is in ``value_ranks``) or ``{"status": "error", "ename", "evalue", "traceback",
    "core"}`` with the core's state at the moment of the error (pending collectives survive
    a KeyboardInterrupt until the magic aborts them). ``token`` labels what the watch thread
    publishes meanwhile.
    """
    global _watch
    shell = _shell()
    if _CORE_MODULE and _watch is None:
        _watch = _Watch()
    if _watch is not None:
        _watch.token = token
    try:
        result = shell.run_cell(code, store_history=True)
    finally:
        _ignore_late_interrupts()  # the cell's code has run: Note [Late interrupts]
        if _watch is not None:
            _watch.token = None
    err = result.error_before_exec or result.error_in_exec
    if err is None:
        keep = value_ranks is None or RANK in value_ranks
        return {"status": "ok", "value": _portable(result.result) if keep else None}
    evalue = str(err)
    if isinstance(err, RuntimeError) and "loop is already running" in evalue:
        evalue = ("top-level await is not supported in %%hvd cells; "
                  "wrap the code in asyncio.run(...) or a function")
    return {"status": "error", "ename": type(err).__name__, "evalue": evalue,
            "traceback": list(getattr(shell, "_last_traceback", None) or []),
            "core": core_state()}


def push(namespace: dict) -> None:
    _shell().user_ns.update(namespace)


def pull(names):
    ns = _shell().user_ns
    missing = [n for n in names if n not in ns]
    if missing:
        raise NameError(f"name(s) {', '.join(map(repr, missing))} not defined on rank {RANK}")
    return [_portable(ns[n]) for n in names]
