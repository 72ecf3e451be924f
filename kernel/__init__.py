"""The hvd cluster kernel (installed as ``hvd_magic.kernel``): a Jupyter kernel, "Python 3 (hvd
cluster)", in which every cell runs on all ranks.

Install it once, then pick it in Jupyter::

    $ python -m hvd_magic.kernel install -n 4 --launcher mpi     # --user by default
    $ jupyter kernelspec list
      hvd-cluster    ~/.local/share/jupyter/kernels/hvd-cluster
    $ python -m hvd_magic.kernel uninstall

In a notebook on this kernel, the first cell that needs the ranks starts the cluster
(``%hvd_start`` with N and the launcher from the kernelspec), every cell then runs on all ranks
exactly as a ``%%hvd`` cell would (streamed and collapsed output, one error report for many
ranks, interrupts that abort collectives and keep the cluster), ``%%local`` runs a cell in the
kernel itself, and cells of line magics (``%hvd_status``, ``%hvd_restart``, ...) run there too.
Tab completion and Shift-Tab inspection answer from rank 0's namespace. Shutting down or
restarting the kernel stops the cluster.

Modules: :mod:`.routing` (which cell runs where; pure rules), :mod:`.kernel` (the ipykernel
subclass), :mod:`.remote` (completion and inspection on rank 0), :mod:`.kernelspec` (install
and uninstall). This package is imported on the engines too (for :mod:`.remote`), so it loads
nothing heavy: the kernel class is imported on first use.
"""

from .kernelspec import DEFAULT_NAME, DISPLAY_NAME, install, uninstall

__all__ = ["DEFAULT_NAME", "DISPLAY_NAME", "HvdKernel", "install", "uninstall"]


def __getattr__(name):
    if name == "HvdKernel":
        from .kernel import HvdKernel
        return HvdKernel
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
