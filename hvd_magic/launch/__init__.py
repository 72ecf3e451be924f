"""Launchers: ``hvdrun`` (command line), :func:`run` (a function on N ranks), and the pieces
that HorovodRunner and the Spark runner share (process supervision, output, pickling).

Light on purpose: importing this package imports neither IPython nor torch nor the core.
"""

from .runfn import RankFailedError, run

__all__ = ["RankFailedError", "run"]
