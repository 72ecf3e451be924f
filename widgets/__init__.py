"""The live dashboard of hvd-magic (installed as ``hvd_magic.widgets``).

Engine side: :func:`start_publisher` (it reads what ``hvd.report(samples=...)`` counted in
``engine_native.progress``).
Driver side: :func:`start_dashboard` → a started :class:`MetricsHub` feeding a
:class:`DashboardModel` into the widget view or the text status.

Importing this package loads neither ipywidgets, IPython nor zmq.
"""

from .model import DashboardModel
from .publisher import Publisher, set_cell, start_publisher, stop_publisher
from .snapshot import SCHEMA_VERSION


def __getattr__(name):
    if name == "MetricsHub":
        from .hub import MetricsHub
        return MetricsHub
    if name in ("start_dashboard", "dashboard_mode"):
        from . import startup
        return getattr(startup, name)
    if name == "DashboardView":
        from .view import DashboardView
        return DashboardView
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["DashboardModel", "DashboardView", "MetricsHub", "Publisher", "SCHEMA_VERSION",
           "dashboard_mode", "set_cell", "start_dashboard", "start_publisher",
           "stop_publisher"]
