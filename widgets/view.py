"""The dashboard as stock ipywidgets: a VBox of HTML blocks with inline SVG.

Created and displayed on the notebook's main thread; :meth:`DashboardView.update` is then called
only by the hub's updater thread (≤ 5 Hz, and at each cell's end). Every block is rendered to a
string and assigned only when the string differs from what the frontend already has, so an idle
cluster sends nothing; traits that change together are sent as one message (``hold_sync``).
Button clicks arrive on the main thread (while an awaiting ``%%hvd`` cell runs, ipykernel ≥ 7.4)
and call the callables the magics passed in; the view never imports the magics.
"""

import threading
import time
from html import escape

import ipywidgets as W

from . import fmt
from .sparkline import pipeline_strip, score_plot, sparkline, timeline_strip
from .text import autotune_text, world_text

_COLUMNS = "44px 120px 64px 210px minmax(260px,1fr) 150px 124px"
_GPU_COLUMNS = "44px 120px 64px 170px 64px 40px 56px minmax(220px,1fr) 150px 124px"
_GRID = ("display:grid;grid-template-columns:{};gap:6px;align-items:center;"
         "font:12px/1.5 monospace;white-space:nowrap")
_STATE_COLORS = {"idle": "#777", "running": "#2e7d32", "collective": "#1565c0", "stalled": "#ef6c00",
                 "dead": "#c62828", "starting": "#999"}
_CLICK_GRACE_S = 2.0  # after a click, the button trusts the click until the engines report it
_CELL = '<div{cls} style="overflow:hidden;text-overflow:ellipsis"{title}>{text}</div>'


def _cell(text, title="", cls=""):
    """One grid cell; ``cls`` names it for tests and user CSS (``hvd-rate``, ...)."""
    return _CELL.format(text=text, title=f' title="{escape(title)}"' if title else "",
                        cls=f' class="{cls}"' if cls else "")


def _grid(gpu):
    return _GRID.format(_GPU_COLUMNS if gpu else _COLUMNS)


def header_html(gpu=False):
    """The column titles; ``gpu`` adds the GPU columns (memory held, utilisation, path)."""
    names = ("rank", "host", "pid", "device") + (("gpu mem", "util", "path") if gpu else ()) + (
        "state", "throughput", "last minute")
    return f'<div style="{_grid(gpu)};font-weight:bold;border-bottom:1px solid #ccc">' + "".join(
        _cell(n) for n in names) + "</div>"


def gpu_cells(r):
    """The GPU columns of one rank: memory this rank holds, utilisation, collectives' path
    (empty for a CPU rank)."""
    if not r.device.startswith("cuda"):
        return [_cell("", cls="hvd-gpu-mem"), _cell("", cls="hvd-gpu-util"),
                _cell("", cls="hvd-gpu-path")]
    util = f"{r.gpu_util:.0f}%" if r.gpu_util is not None else "–"
    return [_cell(fmt.mem(r.gpu_mem_used), cls="hvd-gpu-mem"), _cell(util, cls="hvd-gpu-util"),
            _cell(fmt.gpu_path(r.gpu_path), cls="hvd-gpu-path")]


def row_html(r, gpu=False, span_s=None):
    """One rank as a grid row (all engine-provided text escaped); ``gpu`` as in header_html.
    A pipeline rank gets a second line, its last step's strip (``span_s``: seconds its width
    stands for, the same for every rank)."""
    device = escape(fmt.gpu_label(r))
    if r.gpu_name and not gpu:
        device += f" {fmt.mem(r.gpu_mem_used)}"
    color = _STATE_COLORS.get(r.state, "#777")
    state = f'<span style="color:{color};font-weight:bold">{escape(r.detail)}</span>'
    extra = [(k, v) for k, v in r.extra.items() if not (r.pipeline and k == "bubble")]
    if extra:  # (a pipeline's reported bubble is shown with its strip instead)
        state += " · " + escape(" ".join(f"{k}={_short(v)}" for k, v in extra[:3]))
    if r.stale_s is not None:
        state += f' <span style="color:#ef6c00">⚠ no data for {r.stale_s:.0f} s</span>'
    if r.last_error:
        state += ' <span style="color:#c62828">⚠ error</span>'
    through = fmt.rate(r.rate, r.unit)
    if r.ops_rate is not None and r.unit != "samples/s":
        through += f" · {fmt.si(r.ops_rate, 'op/s')}"
    cells = [_cell(f"r{r.rank}"), _cell(escape(r.host or "?"), r.host),
             _cell(str(r.pid) if r.pid is not None else "?"),
             _cell(device, fmt.gpu_title(r), "hvd-device")]
    cells += gpu_cells(r) if gpu else []
    cells += [_cell(state, r.last_error or r.detail, f"hvd-state hvd-{r.state}"),
              _cell(through, cls="hvd-rate"), sparkline(r.spark)]
    if r.pipeline is not None:
        cells.append(pipeline_html(r.pipeline, span_s))
    return (f'<div class="hvd-row" data-rank="{r.rank}" style="{_grid(gpu)}">' + "".join(cells)
            + "</div>")


def pipeline_html(step, span_s=None):
    """A pipeline rank's last training step on a line of its own under the row: the strip
    (:func:`.sparkline.pipeline_strip`), the measured bubble beside the schedule's ideal, the
    schedule and the step's time."""
    shown = len(step.actions)
    more = f" · first {shown} of {shown + step.more} actions" if step.more else ""
    return ('<div class="hvd-pipeline" style="grid-column:2/-1;display:flex;gap:8px;'
            f'align-items:center">{pipeline_strip(step, span_s)}'  # first: strips line up
            f'<span class="hvd-bubble">{fmt.bubble(step)}</span><span style="color:#777">'
            f'{escape(step.schedule)} step {_seconds(step.step_s)}{more}</span></div>')


def _seconds(s):
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


def _short(v):
    return f"{v:.4g}" if isinstance(v, float) else str(v)


def cluster_html(c):
    """The cluster row: totals, straggler spread, fusion ratio, time split."""
    parts = [f"<b>cluster</b> {c.ranks} ranks",
             "total " + fmt.rate(c.total_rate, c.unit)]
    if c.slowest and c.fastest and c.slowest[0] != c.fastest[0]:
        parts.append(f"slowest r{c.slowest[0]} {fmt.rate(c.slowest[1], c.unit)} vs fastest "
                     f"r{c.fastest[0]} {fmt.rate(c.fastest[1], c.unit)} "
                     f"(spread {fmt.pct(c.spread)})")
    if c.fusion is not None:
        parts.append(f"fusion {c.fusion:.1f} tensors/batch")
    if c.split:
        parts.append(" ".join(f"{k} {fmt.pct(c.split[k])}" for k in
                              ("compute", "negotiate", "communicate", "wait", "idle")
                              if k in c.split).replace("idle", "loop idle"))
    if c.straggler is not None:
        parts.append(f'<span style="color:#ef6c00">straggler r{c.straggler}</span>')
    if c.world:
        parts.append(f'<span class="hvd-world" style="color:#6a1b9a">'
                     f'{escape(world_text(c.world))}</span>')
    return ('<div class="hvd-cluster" style="font:12px/1.6 monospace;border-top:1px solid #ccc;'
            'padding-top:2px;display:flex;align-items:center;gap:8px">'
            f'<div style="flex:1 1 auto">{" · ".join(parts)}</div>'
            + sparkline(c.spark, color="#2e7d32") + "</div>")


def autotune_html(at):
    """The autotune panel: phase, progress, parameters, best score, score per sample."""
    if at is None:
        return ""
    text = escape(autotune_text(at))
    return ('<div style="font:12px/1.5 monospace;display:flex;gap:12px;align-items:center">'
            f"<div><b>autotune</b> {text}</div>{score_plot(at.scores)}</div>")


class DashboardView:
    """The widget dashboard.

    Parameters
    ----------
    on_stop : callable, optional
        ``on_stop()``: interrupt every rank (the magics' Stop).
    on_timeline : callable, optional
        ``on_timeline(start: bool)``: start or stop the timeline.
    on_autotune : callable, optional
        ``on_autotune(enable: bool)``: switch the autotuner on or off.
    timeline_span_s : float
        Seconds shown by the live timeline strip.

    Attributes
    ----------
    widget : ipywidgets.VBox
        What is displayed; ``display(view)`` works too.
    assignments : int
        Trait assignments actually made (tests use it to prove unchanged values are skipped).
    """

    def __init__(self, on_stop=None, on_timeline=None, on_autotune=None, timeline_span_s=5.0):
        self._callbacks = {"stop": on_stop, "timeline": on_timeline, "autotune": on_autotune}
        self.timeline_span_s = timeline_span_s
        self.assignments = 0
        self._lock = threading.RLock()
        self._timeline_on = False
        self._autotune_on = False
        self._clicked = {"timeline": float("-inf"), "autotune": float("-inf")}
        self._messages_shown = 0  # show_message calls so far: a click's line never hides a newer one
        self.stop_button = W.Button(description="Stop", icon="stop", button_style="danger",
                                    disabled=on_stop is None, tooltip="interrupt every rank")
        self.timeline_button = W.Button(disabled=on_timeline is None)
        self.autotune_button = W.Button(disabled=on_autotune is None)
        self._label_buttons()
        self.stop_button.on_click(lambda _: self._click("stop", None))
        self.timeline_button.on_click(lambda _: self._click("timeline", not self._timeline_on))
        self.autotune_button.on_click(lambda _: self._click("autotune", not self._autotune_on))
        self.message = W.HTML()
        self.rows_box = W.VBox([W.HTML(header_html())])
        self._rows = {}
        self.cluster = W.HTML()
        self.autotune = W.HTML(layout=W.Layout(display="none"))
        self.timeline = W.HTML()
        controls = W.HBox([self.stop_button, self.timeline_button, self.autotune_button,
                           self.message])
        self.widget = W.VBox([controls, self.rows_box, self.cluster, self.autotune, self.timeline])
        self.widget.add_class("hvd-dashboard")

    def _repr_mimebundle_(self, **kwargs):
        return self.widget._repr_mimebundle_(**kwargs)

    # ---------------------------------------------------------------- writes
    def _set(self, widget, **traits):
        """Assign only traits whose value differs, all in one comm message."""
        changed = {k: v for k, v in traits.items() if getattr(widget, k) != v}
        if not changed:
            return
        with widget.hold_sync():
            for k, v in changed.items():
                setattr(widget, k, v)
        self.assignments += len(changed)

    def _label_buttons(self):
        self._set(self.timeline_button,
                  description="Stop timeline" if self._timeline_on else "Start timeline",
                  icon="circle" if self._timeline_on else "play",
                  button_style="warning" if self._timeline_on else "")
        self._set(self.autotune_button,
                  description="Autotune off" if self._autotune_on else "Autotune on",
                  button_style="info" if self._autotune_on else "")

    def _click(self, name, arg):
        """Run a control's callback on the main thread; report failures in the message area.
        A callback may return a line to show (e.g. "no cell is running")."""
        callback = self._callbacks[name]
        with self._lock:
            shown = self._messages_shown
        try:
            said = callback() if arg is None else callback(arg)
        except Exception as exc:  # shown to the user, never raised into the comm handler
            self.show_message(f"{name}: {type(exc).__name__}: {exc}", error=True)
            return
        with self._lock:
            if name == "timeline":
                self._timeline_on = arg
            elif name == "autotune":
                self._autotune_on = arg
            if name in self._clicked:
                self._clicked[name] = time.monotonic()
            self._label_buttons()
            # The engines' answer may already be shown (the hub thread got it while this thread
            # waited for the lock): "starting..." must not replace "recording to ...".
            if self._messages_shown == shown:
                self.show_message(said if isinstance(said, str) else "")

    def show_message(self, text, error=False):
        """Show a line next to the buttons (e.g. "cluster stopped"); ``""`` clears it. Any
        thread (the hub thread shows the engines' answers)."""
        color = "#c62828" if error else "#555"
        with self._lock:
            self._messages_shown += 1
            self._set(self.message, value=f'<span style="color:{color}">{escape(text)}</span>'
                      if text else "")

    def update(self, model, now):
        """Re-render from the model; called by the hub's updater thread only."""
        with self._lock:
            rows = model.rows(now)
            if set(self._rows) != {r.rank for r in rows}:
                for gone in set(self._rows) - {r.rank for r in rows}:
                    self._rows.pop(gone).close()
                for r in rows:
                    self._rows.setdefault(r.rank, W.HTML())
                header = self.rows_box.children[0]
                self._set(self.rows_box, children=(header,) + tuple(
                    self._rows[r.rank] for r in rows))
            gpu = any(r.device.startswith("cuda") for r in rows)  # GPU columns only with a GPU
            self._set(self.rows_box.children[0], value=header_html(gpu))
            steps = [r.pipeline.step_s for r in rows if r.pipeline is not None]
            span = max(steps) if steps else None  # one time scale for every rank's strip
            for r in rows:
                self._set(self._rows[r.rank], value=row_html(r, gpu, span))
            self._set(self.cluster, value=cluster_html(model.cluster(now)))
            at = model.autotune()
            self._set(self.autotune, value=autotune_html(at))
            self._set(self.autotune.layout, display="" if at is not None else "none")
            lanes = model.timeline(now, self.timeline_span_s)
            self._set(self.timeline, value=timeline_strip(lanes, self.timeline_span_s)
                      if any(lane.bars for lane in lanes) else "")
            settled = {k: time.monotonic() - t >= _CLICK_GRACE_S for k, t in self._clicked.items()}
            active = model.timeline_active()
            if active is not None and settled["timeline"]:
                self._timeline_on = active
            if settled["autotune"] and rows and all(r.state != "starting" for r in rows):
                self._autotune_on = at is not None and at.enabled  # None: never tuned here
            self._label_buttons()
