"""Launching benchmark ranks: one Launch per (system, np, case), the run's Context.

Every launch runs its commands in their own process session under a hard deadline; when it
ends (normally, on timeout, on Ctrl-C or SIGTERM) every process of those sessions, and every
descendant, is killed by pid, so no benchmark leaves processes behind. Launcher side only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

from benchlib import HOROVOD_VENV, RANK_ENTRY, REPO, load_average


def exit_on_sigterm() -> None:
    """Turn SIGTERM (``timeout``, a CI runner) into SystemExit, so every Launch's ``finally``
    still kills the processes it started."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _process_table() -> dict:
    """pid -> (parent pid, session id) for every process now."""
    table = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            table[int(entry)] = (int(fields[1]), int(fields[3]))
        except (OSError, IndexError, ValueError):
            continue
    return table


def kill_session(leader: int) -> None:
    """SIGKILL what a launched command left: every process in the session it leads (each
    command starts with ``start_new_session``, so its session id is its pid) and every
    descendant of those (in case one started a session of its own)."""
    table = _process_table()
    victims = {pid for pid, (_, sid) in table.items() if sid == leader}
    todo = list(victims)
    while todo:
        parent = todo.pop()
        for pid, (ppid, _) in table.items():
            if ppid == parent and pid not in victims:
                victims.add(pid)
                todo.append(pid)
    victims.discard(os.getpid())
    for pid in victims:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@dataclass
class Launch:
    """One benchmark launch: commands (one per process, or one launcher command), results."""
    label: str
    commands: list          # list of (argv, env)
    out_dir: str
    timeout: float
    codes: list = field(default_factory=list)
    error: str = ""
    wall: float = 0.0

    def run(self) -> Launch:
        procs = []
        start = time.monotonic()
        logs = contextlib.ExitStack()
        try:
            for i, (argv, env) in enumerate(self.commands):
                path = os.path.join(self.out_dir, f"proc{i}.log")
                log = logs.enter_context(open(path, "wb"))  # noqa: SIM115 - closed by logs
                procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                              stdin=subprocess.DEVNULL, cwd=REPO,
                                              start_new_session=True))
            deadline = start + self.timeout
            for p in procs:
                left = deadline - time.monotonic()
                try:
                    self.codes.append(p.wait(timeout=max(0.1, left)))
                except subprocess.TimeoutExpired:
                    self.error = f"timed out after {self.timeout:.0f} s"
                    break
        finally:
            for p in procs:  # members keep the session id even after the leader has exited
                kill_session(p.pid)
                p.wait()
            logs.close()
            self.wall = time.monotonic() - start
        if not self.error and any(self.codes):
            self.error = f"exit codes {self.codes}"
        if self.error:
            self.error += ": " + self._log_tail()
        return self

    def _log_tail(self) -> str:
        tails = []
        for name in sorted(os.listdir(self.out_dir)):
            if name.endswith(".log"):
                with open(os.path.join(self.out_dir, name), "rb") as f:
                    text = f.read().decode(errors="replace").strip().splitlines()
                if text:
                    tails.append(f"[{name}] " + " | ".join(text[-3:]))
        return " ".join(tails)[-600:]

    def cleanup(self) -> None:
        shutil.rmtree(self.out_dir, ignore_errors=True)

    def results(self) -> list:
        """Every rank's result dict, ordered by rank."""
        found = []
        for name in os.listdir(self.out_dir):
            if name.startswith("rank") and name.endswith(".json"):
                with open(os.path.join(self.out_dir, name)) as f:
                    found.append(json.load(f))
        return sorted(found, key=lambda r: r["rank"])


def _rank_argv(python: str, system: str, spec_path: str) -> list:
    return [python, RANK_ENTRY, "--system", system, "--spec", spec_path]


def launch(system: str, np_ranks: int, case: str, spec: dict, *, env: dict | None = None,
           timeout: float = 300.0, label: str = "", hosts: int = 0, bind: bool = False) -> Launch:
    """Start ``np_ranks`` ranks of ``system`` running ``case`` with ``spec``; wait; collect.

    Systems: ours, ours-tcp (ours with HVD_TRANSPORT=tcp and a host per rank), ours-torch
    (ours through engine_native.torch, called as Horovod's adapter calls horovod.torch), mpi,
    mpi-tcp (MPICH with MPIR_CVAR_NOLOCAL=1 and its netmod held to TCP), gloo, horovod-mpi (venv mpiexec),
    horovod-gloo (venv horovodrun --gloo). ``hosts`` > 1 (ours and mpi): the ranks spread over
    that many fake hosts in blocks (host_of), ours through HVD_HOSTNAME, MPICH through
    mpich_hosts_env. ``bind``: ours with HVD_CPU_BIND=core, mpiexec's ranks (mpi, horovod-mpi)
    with -bind-to core; gloo's ranks are not bound. Without it each system runs its default:
    ours HVD_CPU_BIND=auto (bound where the ranks outnumber the CPUs by a whole multiple:
    np=4 on 2), the others unbound; HVD_CPU_BIND=none in the environment leaves ours unbound.
    """
    out_dir = tempfile.mkdtemp(prefix=f"hvdbench-{case}-{system}-")
    # Ranks stop starting new sizes after 60% of the timeout (see agreed_iterations).
    spec = dict(spec, case=case, out=out_dir, timeout=timeout,
                deadline=time.time() + 0.6 * timeout)
    spec_path = os.path.join(out_dir, "spec.json")
    with open(spec_path, "w") as f:
        json.dump(spec, f)
    base = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    base.pop("PYTHONPATH", None)
    if bind:
        base["HVD_CPU_BIND"] = "core"
    base.update(env or {})
    mpiexec_bind = ["-bind-to", "core"] if bind else []
    if system in ("ours", "ours-tcp", "ours-torch"):
        # The core of this checkout (a worktree), not whatever `pip install -e` points at.
        base["PYTHONPATH"] = REPO
        secret = os.urandom(32)
        with _rendezvous_module().RendezvousServer(secret) as server:
            commands = _ours_commands(system, np_ranks, spec_path, base, server.address,
                                      secret, hosts)
            return Launch(label or f"{case}/{system}/np{np_ranks}", commands, out_dir,
                          timeout).run()
    commands = []
    if system in ("mpi", "mpi-tcp"):
        if system == "mpi-tcp":
            # NOLOCAL only turns off MPICH's own shared memory: its UCX netmod (the wheel's
            # default) still moves same-host data through UCX's shared-memory transports
            # unless told to use TCP (measured: 4.9 GB/s at 16 MiB "over TCP"; 0.9 with this).
            base.update(MPIR_CVAR_NOLOCAL="1", UCX_TLS="tcp,self", FI_PROVIDER="tcp")
        if hosts > 1:
            base.update(mpich_hosts_env(hosts))
        commands = [(["mpiexec", "-n", str(np_ranks)] + mpiexec_bind +
                     _rank_argv(sys.executable, system, spec_path), base)]
    elif system == "gloo":
        port = free_port()
        for r in range(np_ranks):
            env_r = dict(base, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(r),
                         WORLD_SIZE=str(np_ranks), GLOO_SOCKET_IFNAME="lo")
            commands.append((_rank_argv(sys.executable, system, spec_path), env_r))
    elif system in ("horovod-mpi", "horovod-gloo"):
        venv_bin = os.path.join(HOROVOD_VENV, "bin")
        base["PATH"] = venv_bin + os.pathsep + base.get("PATH", "")
        python = os.path.join(venv_bin, "python")
        if system == "horovod-mpi":
            argv = [os.path.join(venv_bin, "mpiexec"), "-n", str(np_ranks)] + mpiexec_bind
        else:
            argv = [os.path.join(venv_bin, "horovodrun"), "--gloo", "-np", str(np_ranks),
                    "-H", f"localhost:{np_ranks}", "--gloo-timeout-seconds", "60"]
        commands = [(argv + _rank_argv(python, "horovod", spec_path), base)]
    else:
        raise ValueError(f"launch(): unknown system {system!r}")
    return Launch(label or f"{case}/{system}/np{np_ranks}", commands, out_dir, timeout).run()


def _rendezvous_module():
    """engine_native/rendezvous.py loaded by path: the launcher never loads the native core
    (which other engineers may be rebuilding while a benchmark runs). A stand-in package over
    the engine_native folder, whose ``__init__`` never runs, lets the module's relative imports
    (its client and wire modules) resolve to their files."""
    import importlib
    import types

    package = "_hvd_bench_engine_native"
    if package not in sys.modules:
        stand_in = types.ModuleType(package)
        stand_in.__path__ = [os.path.join(REPO, "engine_native")]
        sys.modules[package] = stand_in
    return importlib.import_module(package + ".rendezvous")


def host_of(rank: int, np_ranks: int, hosts: int) -> int:
    """The fake host of ``rank`` when ``np_ranks`` spread over ``hosts`` in blocks (np 4 over 2
    hosts: ranks 0-1 on host 0, 2-3 on host 1), as ``hvdrun -H a:2,b:2`` places them and
    MPICH's CLIQUES_BY_BLOCK (blocks of ceil(np / hosts): np 3 over 2 gives [0, 1], [2])."""
    return rank // -(-np_ranks // hosts)


def mpich_hosts_env(hosts: int) -> dict:
    """MPICH's fake hosts: MPIR_CVAR_NUM_CLIQUES splits this machine's ranks into ``hosts``
    cliques that see one another as remote (CLIQUES_BY_BLOCK: in blocks, as host_of), so
    between cliques MPICH goes through its netmod, within one through its shared memory.
    UCX_TLS holds that netmod (UCX, the wheel's default) to TCP: otherwise UCX itself moves
    the bytes through shared memory (sysv/cma). Checked with UCX_PROTO_INFO=y (every endpoint
    but self: tcp/eth0) and MPI_COMM_TYPE_SHARED (np 4 over 2: groups [0, 1] and [2, 3])."""
    return {"MPIR_CVAR_NUM_CLIQUES": str(hosts), "MPIR_CVAR_CLIQUES_BY_BLOCK": "1",
            "UCX_TLS": "tcp,self", "FI_PROVIDER": "tcp"}


def ours_rank_envs(system: str, np_ranks: int, base: dict, address: tuple, secret: bytes,
                   hosts: int = 0) -> list:
    """Each rank's environment for our core: ``base`` plus its rank, the rendezvous and, for
    ours-tcp or ``hosts`` > 1, its (fake) host name."""
    host, port = address
    envs = []
    for r in range(np_ranks):
        env_r = dict(base, HVD_RANK=str(r), HVD_SIZE=str(np_ranks),
                     HVD_RENDEZVOUS=f"{host}:{port}", HVD_SECRET=secret.hex(),
                     HVD_JOB_ID=f"bench{os.getpid()}p{port}")
        if system == "ours-tcp":
            env_r.update(HVD_TRANSPORT="tcp", HVD_HOSTNAME=f"benchhost{r}")
        elif hosts > 1:  # shm within a fake host, TCP between them, as on real hosts
            env_r.update(HVD_HOSTNAME=f"benchhost{host_of(r, np_ranks, hosts)}")
        envs.append(env_r)
    return envs


def _ours_commands(system: str, np_ranks: int, spec_path: str, base: dict, address: tuple,
                   secret: bytes, hosts: int = 0) -> list:
    argv = _rank_argv(sys.executable, system, spec_path)
    return [(argv, env) for env in ours_rank_envs(system, np_ranks, base, address, secret, hosts)]


def horovod_available() -> tuple:
    """(True, "") when the Horovod venv imports horovod.torch, else (False, why)."""
    python = os.path.join(HOROVOD_VENV, "bin", "python")
    if not os.path.exists(python):
        return False, f"no Horovod venv at {HOROVOD_VENV} (build it: bash benchmarks/horovod_venv.sh)"
    try:
        code = "import horovod, horovod.torch; print('horovod ' + horovod.__version__)"
        out = subprocess.run([python, "-c", code],
                             capture_output=True, text=True, timeout=60, check=False)
    except subprocess.TimeoutExpired:
        return False, "importing horovod.torch in the venv timed out"
    if out.returncode != 0:
        return False, "horovod.torch does not import in the venv: " + out.stderr.strip()[-200:]
    return True, out.stdout.strip()


def median_figures(runs: list) -> dict:
    """One figures dict from several runs': for each key, the run whose time (a figure's "time",
    or the figure itself when it is a number) is the median (the lower middle for an even
    count), so a figure's numbers stay those of one run."""
    def time_of(figure):
        if isinstance(figure, dict):
            return figure.get("time", 0.0)
        return figure if isinstance(figure, (int, float)) else 0.0

    merged = {}
    for key in {k for figures in runs for k in figures}:
        found = sorted((figures[key] for figures in runs if key in figures), key=time_of)
        merged[key] = found[(len(found) - 1) // 2]
    return merged


class Context:
    """What run_all hands every case module: options, the launch wrapper, collected figures."""

    def __init__(self, nps, quick: bool, horovod: tuple, timeout: float = 300.0):
        self.nps = list(nps)
        self.quick = quick
        self.smoke = False          # --smoke: tiny sizes, a few iterations (the pytest smoke test)
        self.horovod_ok, self.horovod_info = horovod
        self.timeout = timeout
        self.figures: dict = {}     # (case, system, variant, np, size) -> dict of numbers
        self.runs: list = []        # each run's figures, with run_all --repeat
        self.notes: list = []       # misses, failures and skips, printed at the end
        self.loads: list = []       # (label, load average before the launch)
        self.allowed = None         # --systems: families to run (ours, mpi, gloo, horovod)
        self.bind = False           # --bind: ranks bound to CPUs (launch's bind)

    def systems(self, *names) -> list:
        """``names`` minus the Horovod ones when the venv is missing."""
        names = [s for s in names if self.horovod_ok or not s.startswith("horovod")]
        if self.allowed is not None:
            names = [s for s in names if s.split("-")[0] in self.allowed]
        return names

    def run(self, system: str, np_ranks: int, case: str, spec: dict, env=None,
            label: str = "", hosts: int = 0) -> list:
        """Launch, report progress, return every rank's results ([] on failure, noted)."""
        label = label or f"{case}/{system}/np{np_ranks}"
        load = load_average()
        self.loads.append((label, load))
        print(f"  .. {label:<40} load {load}", end="", flush=True)
        job = launch(system, np_ranks, case, spec, env=env, timeout=self.timeout, label=label,
                     hosts=hosts, bind=self.bind)
        results = job.results()
        complete = len(results) == np_ranks
        print(f"  {job.wall:6.1f} s" + ("" if not job.error else "  (!)"), flush=True)
        if job.error and not complete:
            self.notes.append(f"{label} failed: {job.error}")
        elif job.error and any(r.get("partial") for r in results):
            self.notes.append(f"{label}: {job.error[:120]}; kept the sizes finished before")
        elif job.error:
            self.notes.append(f"{label}: results complete, but the exit was unclean: "
                              f"{job.error[:200]}")
        job.cleanup()
        return results if complete else []
