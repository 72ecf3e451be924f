"""Run a module-level test function on N fresh rank processes.

Parent side: :func:`run_ranks` starts a :class:`RendezvousServer`, starts ``np`` rank processes
(forked from a warm zygote that has imported numpy and torch, never from the test process:
zygote.py) with the bootstrap environment (``HVD_RANK``, ``HVD_SIZE``, ``HVD_RENDEZVOUS``,
``HVD_SECRET``, ``HVD_JOB_ID``, ``HVD_TIMEOUT``, optional ``HVD_HOSTNAME``), waits under a hard
timeout, and collects every rank's exit code, output, traceback and return value.
:func:`run_mpi` does the same under ``mpiexec`` (cold processes).

Child side: ``python harness.py SPEC`` imports the test module by file path, calls the
function and pickles ``{"ok", "value", "traceback"}`` into the result directory. Ranks call
``engine_native.init()`` themselves.

Every child gets its own session, so teardown kills whole process groups (``os.killpg``),
including anything a rank started. A rank also dies with the process that spawned it
(``PR_SET_PDEATHSIG``): a test run killed from outside (a CI timeout, Ctrl-C twice) leaves no
rank behind waiting for its peers.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.util
import inspect
import os
import pickle
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any, Callable, Optional, Sequence

try:  # multiproc.harness in the test process, harness in a rank (its folder comes first)
    from . import zygote
except ImportError:
    import zygote

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

# Variables a launcher would set; inherited values must never leak into a test's ranks.
_BOOTSTRAP_VARS = (
    "HVD_RANK", "HVD_SIZE", "HVD_LOCAL_RANK", "HVD_LOCAL_SIZE", "HVD_CROSS_RANK",
    "HVD_CROSS_SIZE", "HVD_RENDEZVOUS", "HVD_SECRET", "HVD_JOB_ID", "HVD_HOSTNAME",
    "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
    "HOROVOD_GLOO_RENDEZVOUS_ADDR", "HOROVOD_GLOO_RENDEZVOUS_PORT", "MPI_LOCALRANKID",
)
_BOOTSTRAP_PREFIXES = ("OMPI_", "PMI_", "PMIX_", "HYDI_", "HYDRA_", "MPIR_")


@dataclasses.dataclass
class RankResult:
    rank: int
    returncode: Optional[int]  # negative: killed by that signal
    stdout: str
    stderr: str
    ok: bool  # the function returned (as opposed to raised or the process died)
    value: Any = None
    traceback: str = ""

    def describe(self, tail: int = 4000) -> str:
        parts = [f"--- rank {self.rank}: exit code {self.returncode}, "
                 f"{'returned' if self.ok else 'FAILED'} ---"]
        if self.traceback:
            parts.append(self.traceback.rstrip())
        if self.stderr.strip():
            parts.append("[stderr] " + _tail(self.stderr, tail))
        if self.stdout.strip():
            parts.append("[stdout] " + _tail(self.stdout, tail))
        return "\n".join(parts)


def _tail(text: str, n: int) -> str:
    text = text.rstrip()
    return text if len(text) <= n else "..." + text[-n:]


def clean_env(extra: Optional[dict] = None) -> dict:
    """os.environ without inherited bootstrap variables, plus quiet-threading defaults."""
    env = {k: v for k, v in os.environ.items()
           if k not in _BOOTSTRAP_VARS and not k.startswith(_BOOTSTRAP_PREFIXES)}
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("MKL_NUM_THREADS", "1")
    env.setdefault("OPENBLAS_NUM_THREADS", "1")
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONFAULTHANDLER"] = "1"
    path = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join([REPO] + [p for p in path if p != REPO])
    env.update({k: str(v) for k, v in (extra or {}).items()})
    return env


def _target(fn: Callable) -> dict:
    if not callable(fn) or "<locals>" in fn.__qualname__ or fn.__name__ == "<lambda>":
        raise TypeError("run_ranks needs a module-level function (it is imported by path in "
                        f"every rank), got {fn!r}")
    return {"file": os.path.abspath(inspect.getsourcefile(fn)), "module": fn.__module__,
            "qualname": fn.__qualname__}


def _write_spec(workdir: str, fn: Callable, args: Sequence, kwargs: dict) -> str:
    spec = dict(_target(fn), args=tuple(args), kwargs=dict(kwargs), results=workdir)
    path = os.path.join(workdir, "spec.pkl")
    with open(path, "wb") as fh:
        pickle.dump(spec, fh)
    return path


def _kill_group(proc, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


def _wait_all(procs: list, deadline: float) -> bool:
    """Wait for every process; False when the deadline passed first."""
    for proc in procs:
        remaining = deadline - time.monotonic()
        try:
            proc.wait(timeout=max(remaining, 0.01))
        except subprocess.TimeoutExpired:
            return False
    return True


def _dump_stacks_and_kill(procs: list) -> None:
    """SIGUSR1 makes live ranks print their Python stacks (faulthandler), then SIGKILL all."""
    alive = [p for p in procs if p.poll() is None]
    for proc in alive:
        _kill_group(proc, signal.SIGUSR1)
    _wait_all(alive, time.monotonic() + 1.0)
    for proc in procs:
        _kill_group(proc, signal.SIGKILL)
    for proc in procs:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def _collect(workdir: str, n: int, returncodes: list) -> list:
    results = []
    for rank in range(n):
        out = _read(os.path.join(workdir, f"rank{rank}.out"))
        err = _read(os.path.join(workdir, f"rank{rank}.err"))
        res = RankResult(rank, returncodes[rank], out, err, ok=False)
        try:
            with open(os.path.join(workdir, f"rank{rank}.pkl"), "rb") as fh:
                payload = pickle.load(fh)
            res.ok, res.value, res.traceback = payload["ok"], payload["value"], payload["tb"]
        except FileNotFoundError:
            res.traceback = "(no result: the process died before the function returned)"
        except Exception as exc:  # unpicklable result: report, don't mask other ranks
            res.traceback = f"(result unreadable: {exc!r})"
        results.append(res)
    return results


def _read(path: str) -> str:
    with contextlib.suppress(FileNotFoundError), open(path, errors="replace") as fh:
        return fh.read()
    return ""


def _report(title: str, results: list) -> str:
    return title + "\n" + "\n".join(r.describe() for r in results)


def _finish(procs, workdir, np, timeout, check, label):
    try:
        finished = _wait_all(procs, time.monotonic() + timeout)
        if not finished:
            _dump_stacks_and_kill(procs)
    finally:
        for proc in procs:  # anything a rank started in its session goes too
            _kill_group(proc, signal.SIGKILL)
    codes = [p.returncode for p in procs]
    results = _collect(workdir, np, codes + [None] * (np - len(codes)))
    if not finished:
        raise AssertionError(_report(f"{label}: timed out after {timeout:g} s "
                                     "(stacks of live ranks in their stderr)", results))
    if check and not all(r.ok and r.returncode == 0 for r in results):
        bad = [r.rank for r in results if not (r.ok and r.returncode == 0)]
        raise AssertionError(_report(f"{label}: rank(s) {bad} failed", results))
    return results


@functools.lru_cache(maxsize=1)
def _switch_names() -> frozenset:
    """The core's HVD_TEST_* switches, as its sources name them (HVD_TEST_SWITCH("NAME"))."""
    csrc = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
        os.path.abspath(__file__)))), "engine_native", "csrc")
    names = set()
    for folder, _, files in os.walk(csrc):
        for name in files:
            with open(os.path.join(folder, name), errors="replace") as fh:
                names.update(re.findall(r'HVD_TEST_SWITCH\("([A-Z0-9_]+)"\)', fh.read()))
    return frozenset("HVD_TEST_" + n for n in names)


def _require_test_switches(envs: Sequence[dict]) -> None:
    """A test that sets an HVD_TEST_* switch needs a core that reads them (common/test_switch.h):
    without one the switch would silently do nothing and the test would check the wrong thing."""
    wanted = sorted({k for e in envs for k in e} & _switch_names())
    from engine_native import _core
    if wanted and not _core.TEST_SWITCHES:
        raise AssertionError(
            f"this test sets {', '.join(wanted)}, but engine_native._core was built without the "
            "test switches: build it with ./dev.sh, or HVD_TEST_SWITCHES=1 python setup.py "
            "build_ext --inplace")


def run_ranks(fn: Callable, np: int, env: Optional[dict] = None, timeout: float = 60,
              hosts: Optional[Sequence[str]] = None, *, args: Sequence = (),
              kwargs: Optional[dict] = None, rank_env: Optional[dict] = None,
              check: bool = True) -> list:
    """Run ``fn(*args, **kwargs)`` in ``np`` rank processes; return a RankResult per rank.

    Parameters
    ----------
    fn : module-level function, imported by path in every rank.
    np : number of ranks.
    env : extra environment for every rank (e.g. ``{"HVD_TRANSPORT": "tcp"}``).
    timeout : hard limit in seconds for the whole run; on expiry every rank is killed and an
        AssertionError shows every rank's output and stack.
    hosts : per-rank ``HVD_HOSTNAME`` (fake hosts on loopback for multi-host code paths).
    rank_env : ``{rank: {VAR: value}}`` for per-rank extras.
    check : raise AssertionError (with every rank's traceback) unless every rank returned and
        exited 0; with ``check=False`` the caller inspects the results (fault tests).
    """
    from engine_native.rendezvous import RendezvousServer

    if hosts is not None and len(hosts) != np:
        raise ValueError(f"hosts has {len(hosts)} entries for {np} ranks")
    _require_test_switches([env or {}] + list((rank_env or {}).values()))
    secret = secrets.token_bytes(32)
    workdir = tempfile.mkdtemp(prefix="hvd-ranks-")
    procs: list = []
    try:
        with RendezvousServer(secret) as server:
            host, port = server.address
            spec = _write_spec(workdir, fn, args, kwargs or {})
            base = clean_env(env)
            base.update(HVD_SIZE=str(np), HVD_RENDEZVOUS=f"{host}:{port}",
                        HVD_SECRET=secret.hex(), HVD_JOB_ID=uuid.uuid4().hex[:12])
            base.setdefault("HVD_TIMEOUT", str(max(5, min(30, int(timeout // 3)))))
            for rank in range(np):
                renv = dict(base, HVD_RANK=str(rank))
                if hosts is not None:
                    renv["HVD_HOSTNAME"] = hosts[rank]
                renv.update({k: str(v) for k, v in (rank_env or {}).get(rank, {}).items()})
                procs.append(_spawn(spec, workdir, rank, renv))
            return _finish(procs, workdir, np, timeout, check, f"run_ranks({fn.__name__}, np={np})")
    finally:
        for proc in procs:
            _kill_group(proc, signal.SIGKILL)
        shutil.rmtree(workdir, ignore_errors=True)


def _spawn(spec: str, workdir: str, rank: int, env: dict):
    """A rank forked from the zygote where its environment allows, else started cold."""
    out, err = (os.path.join(workdir, f"rank{rank}.{suffix}") for suffix in ("out", "err"))
    argv = [os.path.abspath(__file__), spec, str(rank)]
    for path in (out, err):
        open(path, "wb").close()
    warm = zygote.warm_for(env, clean_env(), REPO)
    if warm is not None:  # for _die_with_parent: the zygote is the rank's parent
        return warm.spawn(argv, dict(env, HVD_HARNESS_PARENT=str(warm.pid)), REPO, out, err)
    with open(out, "ab") as out_fh, open(err, "ab") as err_fh:
        return subprocess.Popen([sys.executable] + argv, stdin=subprocess.DEVNULL, stdout=out_fh,
                                stderr=err_fh, env=dict(env, HVD_HARNESS_PARENT=str(os.getpid())),
                                cwd=REPO, start_new_session=True)


def find_mpiexec() -> Optional[str]:
    """mpiexec next to this Python (the PyPI mpich wheel) first, then PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(beside, os.X_OK):
        return beside
    return shutil.which("mpiexec")


def run_mpi(fn: Callable, np: int, env: Optional[dict] = None, timeout: float = 120, *,
            args: Sequence = (), kwargs: Optional[dict] = None, check: bool = True) -> list:
    """Like :func:`run_ranks`, but the ranks are started by ``mpiexec -n np`` and bootstrap
    through MPI (no rendezvous, no HVD_RANK)."""
    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise RuntimeError("mpiexec not found")
    workdir = tempfile.mkdtemp(prefix="hvd-mpi-")
    procs: list = []
    try:
        spec = _write_spec(workdir, fn, args, kwargs or {})
        renv = clean_env(env)
        renv.setdefault("HVD_TIMEOUT", str(max(5, min(30, int(timeout // 3)))))
        cmd = [mpiexec, "-n", str(np), sys.executable, os.path.abspath(__file__), spec, "mpi"]
        with open(os.path.join(workdir, "mpiexec.out"), "wb") as out, \
                open(os.path.join(workdir, "mpiexec.err"), "wb") as err:
            procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
                                          env=renv, cwd=REPO, start_new_session=True))
        try:
            results = _finish(procs, workdir, np, timeout, False, f"run_mpi({fn.__name__})")
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n[mpiexec output]\n{_mpi_output(workdir)}") from None
        if check and (procs[0].returncode != 0 or not all(r.ok for r in results)):
            raise AssertionError(_report(
                f"run_mpi({fn.__name__}, np={np}): mpiexec exit code {procs[0].returncode}",
                results) + f"\n[mpiexec output]\n{_mpi_output(workdir)}")
        return results
    finally:
        for proc in procs:
            _kill_group(proc, signal.SIGKILL)
        shutil.rmtree(workdir, ignore_errors=True)


def _mpi_output(workdir: str) -> str:
    return "\n".join(_tail(_read(os.path.join(workdir, f"mpiexec.{kind}")), 6000)
                     for kind in ("out", "err"))


# --- child side ------------------------------------------------------------------------------

def _mpi_rank() -> int:
    for name in ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK", "MPI_LOCALRANKID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    raise RuntimeError("run under mpiexec but no rank variable (PMI_RANK, ...) is set")


def _load(spec: dict) -> Callable:
    """Import the test module under the name pytest gave it, so its own imports work."""
    name, path = spec["module"], spec["file"]
    parts = name.split(".")
    root = os.path.dirname(path)
    for _ in parts[:-1]:
        root = os.path.dirname(root)
    expected = os.path.join(root, *parts[:-1], parts[-1] + ".py")
    if os.path.abspath(expected) == os.path.abspath(path):
        sys.path.insert(0, root)
        module = importlib.import_module(name)
    else:  # unusual import mode: load the file under its recorded name
        loader_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(loader_spec)
        sys.modules[name] = module
        loader_spec.loader.exec_module(module)
    obj = module
    for part in spec["qualname"].split("."):
        obj = getattr(obj, part)
    return obj


def _die_with_parent() -> None:
    """SIGKILL this rank when the process that spawned it exits; exit now if it already has."""
    parent = os.environ.pop("HVD_HARNESS_PARENT", None)
    if parent is not None:
        zygote.die_with(int(parent))


def _child_main(spec_path: str, rank_arg: str) -> int:
    import faulthandler
    import traceback

    _die_with_parent()
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    with open(spec_path, "rb") as fh:
        spec = pickle.load(fh)
    rank = _mpi_rank() if rank_arg == "mpi" else int(rank_arg)
    if rank_arg == "mpi":  # mpiexec shares one stdout: keep per-rank files like run_ranks
        for stream, suffix in ((1, "out"), (2, "err")):
            fd = os.open(os.path.join(spec["results"], f"rank{rank}.{suffix}"),
                         os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(fd, stream)
            os.close(fd)
    payload = {"ok": False, "value": None, "tb": ""}
    try:
        fn = _load(spec)
        payload["value"] = fn(*spec["args"], **spec["kwargs"])
        payload["ok"] = True
    except BaseException:  # reported to the parent, which raises with every rank's traceback
        payload["tb"] = traceback.format_exc()
        sys.stderr.write(payload["tb"])
    path = os.path.join(spec["results"], f"rank{rank}.pkl")
    try:
        data = pickle.dumps(payload)
    except Exception as exc:
        data = pickle.dumps({"ok": False, "value": None,
                             "tb": f"return value of rank {rank} is not picklable: {exc!r}"})
    with open(path + ".tmp", "wb") as fh:
        fh.write(data)
    os.replace(path + ".tmp", path)
    sys.stdout.flush()
    sys.stderr.flush()
    return 0 if payload["ok"] else 1


if __name__ == "__main__":
    sys.exit(_child_main(sys.argv[1], sys.argv[2]))
