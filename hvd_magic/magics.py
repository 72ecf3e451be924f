"""The ``%hvd_*`` magics: argument parsing, help text and wiring to the cluster and cells.

Each magic's docstring is its ``%magic?`` help. The real work lives in hvd_magic.cluster
(lifecycle), hvd_magic.cellrun (``%%hvd``), hvd_magic.status and hvd_magic.preflight.
A ``%%hvd`` cell is turned into ``await hvd_magic.cell_async(...)`` by an input transformer
(see :func:`hvd_magic.cell_transform.async_cell_transform`) so the notebook awaits the ranks
instead of blocking.
"""

from __future__ import annotations

import atexit

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from . import frameworks
from . import status as status_mod
from .cellrun import CellRun
from .cluster import HvdCluster
from .errors import HvdError, RankError, RanksDead, died
from .ranks import format_ranks, parse_ranks
from .recovery import incomplete_note
from .registration_progress import RegistrationProgress

NO_CLUSTER = "no hvd cluster is running; start one with %hvd_start -n 4"


def _env_pairs(pairs) -> dict:
    env = {}
    for pair in pairs or []:
        key, eq, value = pair.partition("=")
        if not eq or not key:
            raise UsageError(f"--env {pair!r}: expected KEY=VALUE")
        env[key] = value
    return env


@magics_class
class HvdMagics(Magics):
    """Magics for persistent distributed ranks; one cluster per notebook kernel."""

    def __init__(self, shell):
        super().__init__(shell)
        self.cluster: HvdCluster | None = None
        atexit.register(self._stop_quietly)

    @property
    def dashboard(self):
        """The running cluster's dashboard (hvd_magic.dashboard.Dashboard), if it has one."""
        return getattr(self.cluster, "dashboard", None)

    # -- lifecycle --------------------------------------------------------------------------

    @magic_arguments()
    @argument("-n", "--np", dest="n", type=int, default=4, help="number of ranks (default 4)")
    @argument("--launcher", default="mpi",
              help="ipyparallel engine launcher: mpi (default), local, slurm, pbs, ssh, ...")
    @argument("--hosts", default=None, metavar="HOST:N,...",
              help="with --launcher ssh: hosts and engine slots, filled in order, e.g. a:2,b:2")
    @argument("--gpus", choices=("auto", "none"), default="auto",
              help="auto: one GPU per local rank when there are GPUs (it is the rank's "
                   "cuda:0); none: hide GPUs")
    @argument("--mps", dest="mps", action="store_const", const="on", default="auto",
              help="the default when ranks outnumber this machine's GPUs: run them under a "
                   "private NVIDIA MPS daemon (one shared GPU context), stopped with the "
                   "cluster; --mps makes a daemon that cannot start an error")
    @argument("--no-mps", dest="mps", action="store_const", const="off",
              help="never start an MPS daemon (ranks sharing a GPU are time-sliced)")
    @argument("--framework", default=None, choices=sorted(frameworks.FRAMEWORKS),
              help="the binding every rank imports as hvd (default: torch when it is "
                   "installed, else numpy): torch, keras (Keras 3; its backend from "
                   "KERAS_BACKEND, e.g. --env KERAS_BACKEND=jax), jax, tensorflow")
    @argument("--timeout", type=float, default=60.0,
              help="seconds to wait for engines to register and the core to start")
    @argument("--env", action="append", metavar="KEY=VALUE",
              help="environment variable for the engines (repeatable)")
    @argument("--no-dashboard", dest="dashboard", action="store_false",
              help="do not show the live dashboard (%%hvd_dashboard shows it later)")
    @argument("--min-np", dest="min_np", type=int, default=None,
              help="elastic from the start (local launcher): a rank lost in an "
                   "@hvd.elastic.run cell is dropped unless fewer than this many remain")
    @line_magic
    def hvd_start(self, line):
        """Start N persistent ranks (an ipyparallel cluster) and initialise hvd on each.

        Engines start as MPI ranks by default (``mpiexec``), in their own process session
        so a notebook interrupt never kills them. Each rank gets ``hvd``
        (``engine_native.torch`` when torch is installed, or the binding ``--framework``
        names: ``engine_native.keras``, ``.jax``, ``.tensorflow``) and its framework
        (``torch``; ``keras``; ``jax``, ``jnp``, ``optax``; ``tf``) in its namespace
        and, with GPUs, one GPU per local rank, pinned before anything touches CUDA by
        narrowing ``CUDA_VISIBLE_DEVICES`` (hvd_magic.gpu_pinning): the rank's GPU is its
        ``cuda:0``, ``torch.cuda.set_device(hvd.local_rank())`` still selects it, ranks share
        GPUs round robin when they outnumber them (said once), and CPU-only ranks never
        initialise CUDA. Without MPI (``--launcher local``) the
        notebook runs the ranks' rendezvous. Engines get ``OMP_NUM_THREADS`` = cores / N
        unless it is set. Run cells on the ranks with ``%%hvd``. The live dashboard (a row
        per rank, throughput, Stop / timeline / autotune buttons) shows below, unless
        ``--no-dashboard``; ``%hvd_dashboard`` shows it again.

        Examples
        --------
        ::

            In [1]: %load_ext hvd_magic
            In [2]: %hvd_start -n 4
            hvd: 4/4 engines registered
            hvd cluster: 4 ranks, mpi launcher, ready in 8.1 s
            ...
            In [3]: %hvd_start -n 2 --launcher local --env HVD_LOG=info
            In [4]: %hvd_start -n 4 --launcher ssh --hosts node1:2,node2:2
            In [5]: %hvd_start -n 2            # 2 ranks sharing one GPU: under MPS
            hvd: MPS: 2 ranks share 1 GPU(s) on node1: they run under a private MPS daemon
            (--no-mps: time-sliced instead)
            In [6]: %hvd_start -n 4 --launcher local --min-np 2   # elastic: %hvd_scale?
            In [7]: %hvd_start -n 2 --framework jax                # hvd is engine_native.jax
        """
        args = parse_argstring(self.hvd_start, line)
        if self.cluster is not None:
            print(f"hvd: a cluster of {self.cluster.size} ranks is already running "
                  f"(%hvd_stop first to start a different one)")
            status_mod.show_status(status_mod.collect(self.cluster))
            return
        if args.n < 1:
            raise UsageError(f"%hvd_start -n {args.n}: need at least one rank")
        try:
            framework = frameworks.check(args.framework)
        except ValueError as exc:
            raise UsageError(f"%hvd_start: {exc}") from None
        from .scalemagics import check_start_elastic, start_elastic
        check_start_elastic(args)
        cluster = HvdCluster(args.n, args.launcher, args.gpus, args.timeout, _env_pairs(args.env),
                             hosts=args.hosts, mps=args.mps, framework=framework)
        try:
            notes = cluster.start(RegistrationProgress(self.shell))
        except KeyboardInterrupt:
            print("hvd: start interrupted; the cluster was stopped")
            return
        except HvdError as exc:
            raise UsageError(f"%hvd_start: {exc}") from None
        self.cluster = cluster
        self._announce(notes + start_elastic(cluster, args.min_np))
        if args.dashboard:
            from .dashboard import open_dashboard
            cluster.attach_dashboard(open_dashboard(cluster))
        status_mod.emit("started", cluster)

    def _announce(self, notes) -> None:
        for note in notes:
            print(f"hvd: {note}")
        pinned = [r for r in self.cluster.ranks if r.device != "cpu"]
        if pinned:
            print("hvd: GPUs pinned: " + ", ".join(
                f"rank {r.rank} -> {r.device}" + (f" ({r.device_name})" if r.device_name else "")
                for r in pinned))
        else:
            print("hvd: no GPUs in use; ranks run on CPU")
        status_mod.show_status(status_mod.collect(self.cluster, live=False))

    @line_magic
    def hvd_stop(self, line):
        """Stop the cluster: every engine, the controller and helpers; nothing keeps running.

        Examples
        --------
        ::

            In [9]: %hvd_stop
            hvd: cluster stopped
        """
        if self.cluster is None:
            print("hvd: no cluster is running")
            return
        cluster, self.cluster = self.cluster, None
        self._close_dashboard(cluster, engines_alive=True)
        cluster.stop()
        status_mod.emit("stopped", cluster)
        print("hvd: cluster stopped")

    @magic_arguments()
    @argument("--timeout", type=float, default=None,
              help="seconds to wait for the engines (default: the one given to %%hvd_start)")
    @line_magic
    def hvd_restart(self, line):
        """Restart every engine (fresh processes, same size and launcher) and re-initialise.

        Use after a rank died or stopped responding. Engine namespaces start empty again.

        Examples
        --------
        ::

            In [7]: %hvd_restart
            hvd: 4/4 engines registered
            hvd cluster: 4 ranks, mpi launcher, ready in 7.9 s
        """
        args = parse_argstring(self.hvd_restart, line)
        cluster = self._require_cluster()
        if args.timeout is not None:
            cluster.set_timeout(args.timeout)
        try:
            notes = cluster.restart(RegistrationProgress(self.shell))
        except HvdError as exc:
            raise UsageError(f"%hvd_restart: {exc}; %hvd_stop then %hvd_start to begin again") \
                from None
        self._announce(notes)
        status_mod.emit("restarted", cluster)

    @line_magic
    def hvd_status(self, line):
        """Show the ranks: host, pid, device, core state and whether each is idle, busy or dead.

        Examples
        --------
        ::

            In [5]: %hvd_status
            hvd cluster: 2 ranks, local launcher, cluster 1763712000-abcd, ready in 6.8 s
              rank  engine  host  pid    device  core                       state
              0     0       vm    41234  cpu     engine_native.torch ready  idle
              1     1       vm    41240  cpu     engine_native.torch ready  idle
        """
        status_mod.show_status(status_mod.collect(self._require_cluster()))

    # -- data -------------------------------------------------------------------------------

    @magic_arguments()
    @argument("names", nargs="+", help="notebook variables to copy to the ranks")
    @argument("--ranks", default=None, help="which ranks (default all), e.g. 0,2 or 1-3")
    @line_magic
    def hvd_push(self, line):
        """Copy notebook variables to the ranks (same names in each rank's namespace).

        Examples
        --------
        ::

            In [3]: lr, batch_size = 0.01, 64
            In [4]: %hvd_push lr batch_size
            hvd: pushed lr, batch_size to all ranks
        """
        args = parse_argstring(self.hvd_push, line)
        cluster = self._require_cluster()
        ns = self.shell.user_ns
        missing = [n for n in args.names if n not in ns]
        if missing:
            raise UsageError(f"%hvd_push: {', '.join(missing)} not defined in the notebook")
        ranks = self._ranks(args.ranks)
        cluster.view(ranks).push({n: ns[n] for n in args.names}, block=True)
        who = "all ranks" if len(ranks) == cluster.size else f"ranks {format_ranks(ranks)}"
        print(f"hvd: pushed {', '.join(args.names)} to {who}")

    @magic_arguments()
    @argument("names", nargs="+", help="rank variables to copy into the notebook")
    @argument("--rank", default="0", help="rank to read from (default 0), or 'all' for a "
                                          "dict {rank: value} per name")
    @line_magic
    def hvd_pull(self, line):
        """Copy variables from a rank (default rank 0) into the notebook's namespace.

        With ``--rank all`` each name becomes a dict ``{rank: value}``.

        Examples
        --------
        ::

            In [8]: %hvd_pull accuracy
            hvd: pulled accuracy from rank 0
            In [9]: %hvd_pull loss --rank all
            hvd: pulled loss from all ranks (dict by rank)
        """
        args = parse_argstring(self.hvd_pull, line)
        cluster = self._require_cluster()
        ranks = self._ranks(None if args.rank == "all" else args.rank)
        if args.rank != "all" and len(ranks) != 1:
            raise UsageError("%hvd_pull --rank takes one rank or 'all'")
        try:
            values = {r: cluster.client[cluster.ranks[r].engine_id].pull(list(args.names),
                                                                          block=True)
                      for r in ranks}
        except Exception as exc:
            raise UsageError(f"%hvd_pull: {getattr(exc, 'ename', type(exc).__name__)}: "
                             f"{getattr(exc, 'evalue', exc)}") from None
        for i, name in enumerate(args.names):
            per_rank = {r: v[i] for r, v in values.items()}
            self.shell.user_ns[name] = per_rank if args.rank == "all" else per_rank[ranks[0]]
        src = "all ranks (dict by rank)" if args.rank == "all" else f"rank {ranks[0]}"
        print(f"hvd: pulled {', '.join(args.names)} from {src}")

    # -- cells ------------------------------------------------------------------------------

    @magic_arguments()
    @argument("--ranks", default=None, help="run on these ranks only, e.g. 0, 0,2, 1-3, ::2")
    @argument("--timeout", type=float, default=None,
              help="interrupt the cell after this many seconds, abort collectives, recover")
    @argument("--stall-grace", type=float, default=None, metavar="S",
              help="end the cell S s after it can never finish: ranks that finished it and "
                   "the rest blocked in collectives (default $HVD_STALL_GRACE or 10; 0: off)")
    @argument("--no-stream", dest="stream", action="store_false",
              help="show output when the cell ends instead of live")
    @argument("--out", default=None, metavar="NAME",
              help="store every rank's last expression value as NAME = {rank: value}")
    @cell_magic
    def hvd(self, line, cell):
        """Run the cell on every rank (or ``--ranks``); output streams back, prefixed by rank.

        Lines printed identically by all ranks are shown once as ``[all ranks]``; an error
        raised by several ranks is shown once with the list of ranks. Rank 0's last
        expression is the cell's result (``--out NAME`` keeps every rank's). Ctrl-C, the
        dashboard's Stop or ``--timeout`` interrupt every rank, abort collectives in flight,
        report which rank was stuck in which collective, and keep the cluster usable. A cell
        that can never finish (some ranks finished it, the others are blocked in collectives
        that need them) is ended the same way after ``--stall-grace`` seconds.

        Examples
        --------
        ::

            In [4]: %%hvd
               ...: x = torch.ones(2) * hvd.rank()
               ...: print("sum:", hvd.allreduce(x, op=hvd.Sum))
               ...: hvd.rank()
            [all ranks] sum: tensor([6., 6.])
            Out[4]: 0

            In [5]: %%hvd --ranks 0 --timeout 30
               ...: print(model)
        """
        run, out_name = self._prepare(line, cell)
        status_mod.emit("cell_start", run.cluster, run=run)
        try:
            return self._store(run, run.run_sync(), out_name)
        finally:
            status_mod.emit("cell_end", run.cluster, run=run)

    async def hvd_async(self, line: str, cell: str):
        """The awaiting form of ``%%hvd`` (what the cell transformer calls)."""
        run, out_name = self._prepare(line, cell)
        status_mod.emit("cell_start", run.cluster, run=run)
        try:
            return self._store(run, await run.run_async(), out_name)
        finally:
            status_mod.emit("cell_end", run.cluster, run=run)

    def _prepare(self, line: str, cell: str) -> tuple[CellRun, str | None]:
        args = parse_argstring(self.hvd, line)
        cluster = self._require_cluster()
        dead = cluster.dead_ranks()
        if dead:
            raise RanksDead([died(cluster, r, why) for r, why in sorted(dead.items())],
                            list(range(cluster.size)),
                            f"hvd: rank(s) {format_ranks(dead)} of the cluster are dead",
                            [incomplete_note(cluster)])
        busy = cluster.busy_ranks()
        if busy:
            raise RankError([], list(range(cluster.size)),
                            f"hvd: rank(s) {format_ranks(busy)} are still running an earlier "
                            f"cell that ignored the interrupt",
                            ["Run %hvd_restart to start fresh engines."])
        ranks = self._ranks(args.ranks)
        value_ranks = None if args.out else ranks[:1]
        try:
            run = CellRun(cluster, cell, ranks, args.timeout, args.stream, value_ranks,
                          stall_grace=args.stall_grace)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        return run, args.out

    def _store(self, run: CellRun, values: dict, out_name: str | None):
        if out_name:
            self.shell.user_ns[out_name] = values
        return values.get(run.ranks[0])

    # -- helpers ----------------------------------------------------------------------------

    def _require_cluster(self) -> HvdCluster:
        if self.cluster is None:
            raise UsageError(NO_CLUSTER)
        return self.cluster

    def _ranks(self, spec):
        try:
            return parse_ranks(spec, self.cluster.size)
        except ValueError as exc:
            raise UsageError(str(exc)) from None

    @staticmethod
    def _close_dashboard(cluster, engines_alive: bool) -> None:
        if getattr(cluster, "dashboard", None) is not None:
            cluster.detach_dashboard().close(engines_alive=engines_alive)

    def _stop_quietly(self) -> None:
        if self.cluster is not None:
            cluster, self.cluster = self.cluster, None
            self._close_dashboard(cluster, engines_alive=False)
            cluster.stop()
            status_mod.emit("stopped", cluster)
