"""Inline SVG drawings for the dashboard: sparklines, the autotune score plot, the timeline strip,
a pipeline rank's last step.

Pure functions from numbers to an ``<svg>`` string, rendered by an ``ipywidgets.HTML`` (no JS
build step; they also survive static widget-state export). Coordinates are rounded to 0.1 px so
an unchanged series yields a byte-identical string and the view can skip resending it.
Text that came from engines (tensor names) is escaped here.
"""

from html import escape

OP_COLORS = {
    "allreduce": "#4c78a8", "allgather": "#59a14f", "broadcast": "#f28e2b", "alltoall": "#b07aa1",
    "reducescatter": "#76b7b2", "barrier": "#9c9c9c", "join": "#bab0ac",
}
_FALLBACK = "#e15759"
# forward / backward boxes of a pipeline step: a rank's first stage, its second (interleaved)
PIPELINE_COLORS = {"F": ("#4c78a8", "#9ecae9"), "B": ("#f28e2b", "#ffbf79")}
_IDLE = "#e4e4e4"
_DIGIT_PX = 5.5  # width of a digit at 9px monospace


def _pt(x, y):
    return f"{x:.1f},{y:.1f}"


def sparkline(values, width=120, height=22, color="#4c78a8"):
    """A polyline of ``values`` scaled to the box, zero at the bottom.

    Parameters
    ----------
    values : sequence of float
        Oldest first; an empty or single-point sequence draws an empty box of the same size so
        the row layout does not jump.
    width, height : int
        Size in CSS pixels.
    color : str
        Stroke colour.

    Returns
    -------
    str
        An ``<svg>`` element.
    """
    head = (f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
            f'style="vertical-align:middle">')
    if len(values) < 2:
        return head + "</svg>"
    top = max(max(values), 1e-12)
    dx = (width - 2) / (len(values) - 1)
    pts = " ".join(_pt(1 + i * dx, height - 1 - (height - 2) * max(v, 0.0) / top)
                   for i, v in enumerate(values))
    return (head + f'<polyline fill="none" stroke="{color}" stroke-width="1.5" points="{pts}"/>'
            "</svg>")


def score_plot(scores, width=220, height=64):
    """Autotune score per sample: one dot per sample, a line for the best so far.

    Parameters
    ----------
    scores : sequence of (int, float)
        ``(sample, score)`` ascending by sample.

    Returns
    -------
    str
        An ``<svg>`` element (empty box when there are no scores).
    """
    head = f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
    if not scores:
        return head + "</svg>"
    xs = [s for s, _ in scores]
    lo_x, hi_x = min(xs), max(max(xs), min(xs) + 1)
    top = max(max(v for _, v in scores), 1e-12)

    def place(s, v):
        return (4 + (width - 8) * (s - lo_x) / (hi_x - lo_x),
                height - 4 - (height - 8) * max(v, 0.0) / top)

    dots, best_pts, best = [], [], float("-inf")
    for s, v in scores:
        x, y = place(s, v)
        dots.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2" fill="#4c78a8"/>')
        best = max(best, v)
        best_pts.append(_pt(*place(s, best)))
    line = (f'<polyline fill="none" stroke="#59a14f" stroke-width="1.2" '
            f'points="{" ".join(best_pts)}"/>')
    return head + line + "".join(dots) + "</svg>"


def timeline_strip(lanes, span_s=5.0, width=600, lane_height=12):
    """The last ``span_s`` seconds of collectives, one lane per rank, now at the right edge.

    Bars of the same op that touch or sit less than a pixel apart are drawn as one rect (a
    training loop runs hundreds of allreduces a second; drawn one by one they made a strip of
    ~1 MB resent 5 times a second), so a lane holds at most about one rect per pixel.

    Parameters
    ----------
    lanes : sequence of model.Lane
        Bars as ``(op, name, start, duration, open)``, start relative to now (negative).
    span_s : float
        Seconds shown.
    width, lane_height : int
        Size in CSS pixels; a 28 px gutter on the left holds the rank labels.

    Returns
    -------
    str
        An ``<svg>`` element; each rect has a ``<title>`` tooltip: op, name and duration, or
        for merged bars their count and total duration.
    """
    gutter = 28
    height = max(1, len(lanes)) * lane_height + 2
    scale = (width - gutter - 2) / span_s
    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'style="font:9px monospace">']
    for i, lane in enumerate(lanes):
        y = 1 + i * lane_height
        parts.append(f'<text x="0" y="{y + lane_height - 3}">r{lane.rank}</text>'
                     f'<rect x="{gutter}" y="{y}" width="{width - gutter - 2}" '
                     f'height="{lane_height - 2}" fill="#f4f4f4"/>')
        for x, w, op, name, count, dur, is_open in _runs(lane.bars, span_s, scale, gutter):
            color = OP_COLORS.get(op, _FALLBACK)
            stroke = ' stroke="#e15759" stroke-width="1"' if is_open else ""
            what = f"{op} {name}" if count == 1 else f"{count} x {op} ({name}, ...)"
            tip = escape(f"{what} {dur * 1e3:.1f} ms" + (" (running)" if is_open else ""))
            parts.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{lane_height - 2}" '
                         f'fill="{color}"{stroke}><title>{tip}</title></rect>')
    parts.append("</svg>")
    return "".join(parts)


def _runs(bars, span_s, scale, gutter):
    """Visible bars in pixels, neighbours of one op merged: (x, w, op, first name, count,
    total duration, open)."""
    runs, last = [], None
    for bar in sorted(bars, key=lambda b: b[2]):
        op, name, start, dur, is_open = bar[:5]
        count, busy = (bar[5], bar[6]) if len(bar) > 5 else (1, dur)
        t0, t1 = max(start, -span_s), min(start + dur, 0.0)
        if t1 < t0:
            continue
        x0 = gutter + (t0 + span_s) * scale
        x1 = x0 + max((t1 - t0) * scale, 1.0)
        if last and last[2] == op and not (is_open or last[6]) and x0 <= last[0] + last[1] + 1.0:
            last[1] = max(last[1], x1 - last[0])
            last[4] += count
            last[5] += busy
        else:
            last = [x0, x1 - x0, op, name, count, busy, is_open]
            runs.append(last)
    return runs


def pipeline_strip(step, span_s=None, width=480, height=14):
    """One rank's last pipeline training step on one line: a box per forward (blue) and
    backward (orange), placed by time from the step's start at the left edge, over grey that
    shows through wherever the rank was idle (the bubble). Boxes wide enough carry their
    micro-batch number; a rank's second and later stages (interleaved 1F1B) are lighter.

    Parameters
    ----------
    step : rows.PipelineStep
        ``actions`` as ``(kind, stage, microbatch, start, end)``, seconds from the step's start.
    span_s : float, optional
        Seconds the width stands for (the slowest rank's step, so strips of several ranks
        share one scale); the step's own time by default.
    width, height : int
        Size in CSS pixels.

    Returns
    -------
    str
        An ``<svg>`` element; each box has a ``<title>`` tooltip naming the action.
    """
    span = max(span_s or step.step_s, step.step_s, 1e-9)
    scale = width / span
    parts = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
             'style="vertical-align:middle;font:9px monospace">',
             f'<rect x="0" y="0" width="{step.step_s * scale:.1f}" height="{height}" '
             f'fill="{_IDLE}"><title>idle</title></rect>']
    chunk = {s: i for i, s in enumerate(sorted({a[1] for a in step.actions}))}
    for kind, stage, mb, start, end in step.actions:
        x, w = start * scale, max((end - start) * scale, 0.5)
        color = PIPELINE_COLORS[kind][min(chunk[stage], 1)]
        what = "forward" if kind == "F" else "backward"
        tip = escape(f"{what} of micro-batch {mb}, stage {stage}: {(end - start) * 1e3:.2f} ms")
        parts.append(f'<rect class="hvd-{what}" x="{x:.1f}" y="0" width="{w:.1f}" '
                     f'height="{height}" fill="{color}"><title>{tip}</title></rect>')
        if w >= _DIGIT_PX * len(str(mb)) + 2:
            parts.append(f'<text x="{x + w / 2:.1f}" y="{height - 4}" text-anchor="middle" '
                         f'fill="#fff" pointer-events="none">{mb}</text>')
    parts.append("</svg>")
    return "".join(parts)
