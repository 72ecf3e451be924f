"""``%hvd_dashboard``, ``%hvd_timeline`` and ``%hvd_autotune``: the dashboard and the core's
timeline and autotuner from the notebook.

Registered next to :class:`hvd_magic.magics.HvdMagics` (whose cluster and dashboard they use)
by ``%load_ext hvd_magic``. The timeline and autotune magics run on every rank through the
cluster's view (between cells, so the engines answer at once); the dashboard's buttons do the
same through the publishers while a cell runs (hvd_magic.dashboard).
"""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from . import engine_dashboard
from .dashboard import ask_ranks, open_dashboard, summarize, timeline_path
from .ranks import format_ranks

RUN_TIMEOUT = 10.0  # s for every rank to answer


@magics_class
class DashboardMagics(Magics):
    """Dashboard, timeline and autotune magics of the cluster owned by ``main``."""

    def __init__(self, shell, main):
        super().__init__(shell)
        self.main = main  # the HvdMagics instance

    def _cluster(self):
        return self.main._require_cluster()

    @magic_arguments()
    @argument("--off", action="store_true",
              help="stop the dashboard (engines stop publishing metrics)")
    @line_magic
    def hvd_dashboard(self, line):
        """Show the live dashboard of the cluster again (or start it, or ``--off`` stop it).

        One row per rank: host, pid, device (GPU name and memory), state (idle, running,
        in a collective, stalled, dead), throughput (samples/s from ``hvd.report(samples=n)``
        calls on the ranks, else allreduce bytes/s and ops/s) and a one-minute sparkline;
        a cluster row (total throughput, slowest vs fastest rank, fusion, time split); the
        autotuner's panel and a live timeline strip of the collectives. Buttons: Stop
        (interrupts the running ``%%hvd`` cell like Ctrl-C), start/stop a timeline (rank 0
        writes ``hvd-timeline-<date>.json`` in the working directory), autotune on/off.
        Updated at most 5 times a second from a background thread, and once more when a
        ``%%hvd`` cell ends, before it returns. Without a widget frontend the dashboard is
        printed as text.

        Examples
        --------
        ::

            In [2]: %hvd_start -n 4 --no-dashboard
            In [3]: %%hvd
               ...: for batch in loader:
               ...:     train_step(batch)
               ...:     hvd.report(samples=len(batch), loss=float(loss))
            In [4]: %hvd_dashboard
            hvd: 4 ranks (4 idle) · 1.9k samples/s · spread 3% (slowest r2)
              r0 node1 pid 4242 cpu idle · 480 samples/s
              ...
            In [5]: %hvd_dashboard --off
            hvd: dashboard off
        """
        args = parse_argstring(self.hvd_dashboard, line)
        cluster = self._cluster()
        dash = cluster.dashboard
        if args.off:
            self.main._close_dashboard(cluster, engines_alive=True)
            print("hvd: dashboard off")
            return
        if dash is not None and dash.running:
            dash.show()
            return
        self.main._close_dashboard(cluster, engines_alive=True)
        cluster.attach_dashboard(open_dashboard(cluster))

    def _run_everywhere(self, what: str, fn, *args) -> None:
        cluster = self._cluster()
        busy = cluster.busy_ranks()
        if busy:
            raise UsageError(f"%hvd_{what}: ranks {format_ranks(busy)} are busy; wait for the "
                             f"cell or use the dashboard's button, which acts during a cell")
        answers, missing = ask_ranks(cluster, lambda info: (fn, *args), RUN_TIMEOUT)
        text, error = summarize(what, answers, missing)
        if error:
            raise UsageError(f"%hvd_{text}")
        print(f"hvd: {text}")

    @magic_arguments()
    @argument("action", choices=("start", "stop"))
    @argument("path", nargs="?", default=None,
              help="file rank 0 writes (default: hvd-timeline-<date>-<time>.json here)")
    @argument("--mark-cycles", action="store_true",
              help="add a marker for every cycle of the core's background loop")
    @line_magic
    def hvd_timeline(self, line):
        """Record the core's timeline (Chrome trace, Horovod's layout) on every rank; rank 0
        writes the file. Open it in Perfetto or chrome://tracing. The dashboard's timeline
        button does the same while a cell runs.

        Examples
        --------
        ::

            In [5]: %hvd_timeline start /tmp/run1.json
            hvd: timeline: recording to /tmp/run1.json
            In [6]: %%hvd
               ...: train_one_epoch()
            In [7]: %hvd_timeline stop
            hvd: timeline: stopped
        """
        args = parse_argstring(self.hvd_timeline, line)
        start = args.action == "start"
        self._run_everywhere("timeline", engine_dashboard.timeline, start,
                             timeline_path(args.path) if start else None, args.mark_cycles)

    @magic_arguments()
    @argument("action", choices=("on", "off"))
    @line_magic
    def hvd_autotune(self, line):
        """Switch the core's autotuner on or off on every rank (rank 0 tunes fusion threshold,
        cycle time, response cache and hierarchical allreduce while the cells run; off keeps
        the best setting found). Its progress shows in the dashboard's autotune panel.

        Examples
        --------
        ::

            In [5]: %hvd_autotune on
            hvd: autotune: warmup
            In [9]: %hvd_autotune off
            hvd: autotune: done
        """
        args = parse_argstring(self.hvd_autotune, line)
        self._run_everywhere("autotune", engine_dashboard.autotune, args.action == "on")
