"""``%hvd_scale``: resize the running cluster (hvd_magic.scale) and keep the ranks' state.

Registered next to :class:`hvd_magic.magics.HvdMagics` (whose cluster it resizes) by
``%load_ext hvd_magic``.
"""

from __future__ import annotations

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from . import status as status_mod
from .errors import HvdError
from .registration_progress import RegistrationProgress


def check_start_elastic(args) -> None:
    """``%hvd_start --min-np``: refuse before starting anything what cannot be elastic."""
    from .scale import SCALABLE_LAUNCHERS

    if args.min_np is None:
        return
    if args.launcher not in SCALABLE_LAUNCHERS:
        raise UsageError(f"%hvd_start --min-np: the {args.launcher} launcher cannot lose or add "
                         f"single ranks (mpiexec's world is fixed); use --launcher local")
    if not 1 <= args.min_np <= args.n:
        raise UsageError(f"%hvd_start --min-np {args.min_np}: need 1 <= --min-np <= -n {args.n}")
    if args.mps == "on":
        raise UsageError("%hvd_start --min-np: --mps is not supported for elastic clusters (under "
                         "MPS a fatal GPU error in one rank reaches every rank on that GPU); "
                         "drop one")
    args.mps = "off"  # Note [MPS by default]: elastic clusters never get a daemon


def start_elastic(cluster, min_np) -> list[str]:
    """Make a just-started cluster elastic (its ranks join generation 1); notes to print."""
    if min_np is None:
        return []
    from .scale import scale

    try:
        return scale(cluster, cluster.size, min_np)
    except HvdError as exc:
        raise UsageError(f"%hvd_start --min-np {min_np}: {exc}") from None


@magics_class
class ScaleMagics(Magics):
    """``%hvd_scale`` on the cluster owned by ``main`` (the HvdMagics instance)."""

    def __init__(self, shell, main):
        super().__init__(shell)
        self.main = main

    @magic_arguments()
    @argument("-n", "--np", dest="n", type=int, default=None,
              help="number of ranks after the change")
    @argument("--min-np", dest="min_np", type=int, default=None,
              help="never re-form with fewer ranks: a rank lost below this fails the cell "
                   "(default 1)")
    @line_magic
    def hvd_scale(self, line):
        """Grow or shrink the running cluster to N ranks; the ranks keep their variables.

        Growing starts new engines (same launcher, environment and GPU policy; a new rank
        gets a GPU for its local rank and an empty namespace with ``hvd`` and ``torch``);
        shrinking stops the highest ranks. Every rank's core then joins the new world (an
        elastic *generation*), so ``hvd.size()``, ``hvd.rank()`` and ``hvd.local_rank()``
        are right from the next cell on. From the first ``%hvd_scale`` on the cluster is
        elastic: a rank that dies during an ``@hvd.elastic.run`` cell is dropped, the
        others restore the last ``state.commit()``, re-form with one rank fewer and finish
        the cell; ``%hvd_scale`` adds a replacement afterwards. ``--min-np`` sets the
        smallest world the cluster may shrink to (a death below it fails the cell). Needs
        the ``local`` launcher (mpiexec's world is fixed).

        Examples
        --------
        ::

            In [2]: %hvd_start -n 2 --launcher local
            In [3]: %hvd_scale -n 4
            hvd: 2/2 engines registered
            hvd: scaled from 2 to 4 ranks (generation 1) in 6.3 s; ...
            In [4]: %hvd_scale -n 3 --min-np 2
            hvd: scaled from 4 to 3 ranks (generation 2) in 0.4 s; ...
        """
        args = parse_argstring(self.hvd_scale, line)
        cluster = self.main.cluster
        if cluster is None:
            raise UsageError("%hvd_scale: no hvd cluster is running; start one with "
                             "%hvd_start -n 2 --launcher local")
        if args.n is None and args.min_np is None:
            raise UsageError("%hvd_scale: say how many ranks, e.g. %hvd_scale -n 4")
        if args.min_np is not None and args.min_np < 1:
            raise UsageError(f"%hvd_scale --min-np {args.min_np}: need at least 1")
        n = cluster.size if args.n is None else args.n
        from .scale import scale

        try:
            notes = scale(cluster, n, args.min_np, RegistrationProgress(self.shell))
        except HvdError as exc:
            raise UsageError(f"%hvd_scale -n {n}: {exc}") from None
        for note in notes:
            print(f"hvd: {note}")
        status_mod.emit("scaled", cluster)
