"""hvd_magic: persistent distributed ranks in a notebook (Horovod-style, on ipyparallel).

>>> %load_ext hvd_magic
>>> %hvd_start -n 4                 # 4 MPI ranks, hvd initialised on each
>>> %%hvd
... print(hvd.rank(), hvd.allreduce(torch.ones(1) * hvd.rank(), op=hvd.Sum))

Magics: ``%hvd_start``, ``%%hvd``, ``%hvd_stop``, ``%hvd_restart``, ``%hvd_status``,
``%hvd_push``, ``%hvd_pull``, ``%hvd_scale``, ``%hvd_dashboard``, ``%hvd_timeline``,
``%hvd_autotune`` (each
has ``%magic?`` help). Hooks for other code (the dashboard): :func:`interrupt_running_cell`
(its Stop button), :func:`show_status` / :func:`register_status_renderer` (how status is
shown), :func:`add_listener` (cluster and cell events).

This module is also imported on the engines (hvd_magic.engine_side), so it stays light:
IPython and ipyparallel load only when the extension is loaded.
"""

from . import checkout as _checkout
from .interrupts import interrupt_running_cell
from .status import add_listener, register_status_renderer, show_status

_checkout.install(__path__[0])  # a source checkout's widgets/ and kernel/ (see checkout.py)

__all__ = ["load_ipython_extension", "unload_ipython_extension", "cell_async",
           "interrupt_running_cell", "show_status", "register_status_renderer", "add_listener",
           "run", "HorovodRunner"]

_magics = None
_dash_magics = None
_scale_magics = None
_transform = None

_LAZY = {"run": (".launch", "run"), "HorovodRunner": (".runner", "HorovodRunner"),
         "__version__": ("engine_native._version", "__version__")}


def __getattr__(name):
    """``hvd_magic.run``, ``hvd_magic.HorovodRunner`` and ``hvd_magic.__version__`` (the core
    package's: one version for both) load on first use (engines import this package and need
    none of them)."""
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        return getattr(importlib.import_module(module, __name__), attr)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def load_ipython_extension(ipython) -> None:
    """``%load_ext hvd_magic``: register the magics and the ``%%hvd`` await transformer."""
    global _magics, _dash_magics, _scale_magics, _transform
    from .cell_transform import async_cell_transform
    from .dashmagics import DashboardMagics
    from .magics import HvdMagics
    from .scalemagics import ScaleMagics

    if _magics is None or _magics.shell is not ipython:
        _magics = HvdMagics(ipython)
        _dash_magics = DashboardMagics(ipython, _magics)
        _scale_magics = ScaleMagics(ipython, _magics)
    ipython.register_magics(_magics)
    ipython.register_magics(_dash_magics)
    ipython.register_magics(_scale_magics)
    if _transform is None:
        _transform = async_cell_transform(ipython)
        ipython.input_transformers_post.append(_transform)


def unload_ipython_extension(ipython) -> None:
    global _transform
    if _transform in ipython.input_transformers_post:
        ipython.input_transformers_post.remove(_transform)
    _transform = None


async def cell_async(line: str, cell: str):
    """Run a ``%%hvd`` cell and await it (what a ``%%hvd`` cell becomes in a notebook)."""
    if _magics is None:
        raise RuntimeError("%load_ext hvd_magic first")
    return await _magics.hvd_async(line, cell)
