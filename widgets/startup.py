"""Starting the driver's dashboard: which display to use (:func:`dashboard_mode`: widgets, text
or off) and :func:`start_dashboard`, which wires the model, the view (or the text status) and
a started :class:`~.hub.MetricsHub` together and shows the view.
"""

import os

from .hub import MetricsHub
from .model import DashboardModel


def dashboard_mode(requested="auto"):
    """Pick ``"widgets"``, ``"text"`` or ``"off"``.

    ``HVD_DASHBOARD=widgets|text|off`` wins over ``requested``; in "auto", widgets are used in
    a Jupyter kernel with ipywidgets installed unless ``IPP_NONINTERACTIVE`` is set (CI), text
    everywhere else (terminal IPython, plain Python).
    """
    mode = os.environ.get("HVD_DASHBOARD", "").strip().lower() or requested
    if mode in ("widgets", "text", "off"):
        return mode
    if os.environ.get("IPP_NONINTERACTIVE", "").strip() not in ("", "0"):
        return "text"
    try:
        import ipywidgets  # noqa: F401
        from IPython import get_ipython
    except ImportError:
        return "text"
    shell = get_ipython()
    return "widgets" if shell is not None and getattr(shell, "kernel", None) else "text"


def start_dashboard(size=None, key=None, bind="tcp://127.0.0.1", connect_host=None,
                    on_stop=None, on_timeline=None, on_autotune=None, mode="auto",
                    display=True, model=None, **model_options):
    """Create the model, the view (or text status) and the hub; start it; show the view.

    Call from the notebook's main thread (widgets are created and displayed here; only the
    hub thread mutates them afterwards).

    Parameters
    ----------
    size : int, optional
        Ranks expected (shown as "starting" until their first snapshot).
    key, bind, connect_host
        See :class:`MetricsHub`.
    on_stop, on_timeline, on_autotune : callable, optional
        Controls, see :class:`~.view.DashboardView`.
    mode : {"auto", "widgets", "text", "off"}
        See :func:`dashboard_mode`.
    display : bool
        Display the widget view now.
    model : DashboardModel, optional
    **model_options
        Passed to :class:`DashboardModel` (``stall_after_s``, ...).

    Returns
    -------
    MetricsHub
        Started; ``hub.view`` is the :class:`~.view.DashboardView` (None in text mode) and
        ``hub.address`` what publishers connect to.
    """
    model = model if model is not None else DashboardModel(size=size, **model_options)
    mode = dashboard_mode(mode)
    view, sinks = None, []
    if mode == "widgets":
        from .view import DashboardView
        view = DashboardView(on_stop=on_stop, on_timeline=on_timeline, on_autotune=on_autotune)
        sinks.append(view)
    elif mode == "text":
        from .text import TextStatus
        sinks.append(TextStatus())
    hub = MetricsHub(model, sinks, key=key, bind=bind, connect_host=connect_host)
    hub.view = view
    hub.start()
    if view is not None and display:
        from IPython.display import display as show
        show(view)
    return hub
