"""Number formatting shared by the widget view and the text status.

Three significant digits everywhere: enough to read, and coarse enough that a re-render with
an unchanged display string is skipped instead of resent.
"""

from .gpu_stats import GPU_PATHS
from .model import SAMPLES


def si(value, unit=""):
    """``1234567, "B/s"`` → ``'1.23 MB/s'`` (decimal prefixes); ``None`` → ``'–'``."""
    if value is None:
        return "–"
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{_sig3(value / factor)} {prefix}{unit}"
    return f"{_sig3(value)} {unit}".rstrip()


def _sig3(x):
    if abs(x) >= 100:
        return f"{x:.0f}"
    if abs(x) >= 10:
        return f"{x:.1f}"
    return f"{x:.2f}"


def rate(value, unit):
    """A throughput in its unit: ``'812 samples/s'``, ``'1.23k samples/s'`` or ``'1.23 GB/s'``."""
    if unit == SAMPLES and value is not None:
        return si(value).replace(" ", "") + " samples/s"
    return si(value, "B/s")


def mem(nbytes):
    """Bytes in binary units: ``'3.2 GiB'``."""
    if nbytes is None:
        return "–"
    for factor, unit in ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if nbytes >= factor:
            return f"{nbytes / factor:.1f} {unit}"
    return f"{nbytes} B"


def pct(fraction):
    """``0.123`` → ``'12%'``."""
    return "–" if fraction is None else f"{100 * fraction:.0f}%"


def bubble(step):
    """A pipeline step's measured idle fraction beside its schedule's:
    ``'bubble 15.6% (ideal 11.1%)'``."""
    return f"bubble {100 * step.bubble:.1f}% (ideal {100 * step.ideal:.1f}%)"


def params(d):
    """``{'fusion_threshold': 67108864, 'cycle_time_ms': 5}`` → ``'fusion_threshold=64.0 MiB
    cycle_time_ms=5'`` (byte-sized values recognised by name)."""
    parts = []
    for k, v in d.items():
        if isinstance(v, (int, float)) and not isinstance(v, bool) and ("threshold" in k or "bytes" in k):
            v = mem(int(v))
        elif isinstance(v, float):
            v = _sig3(v)
        parts.append(f"{k}={v}")
    return " ".join(parts) if parts else "–"


def gpu_label(row):
    """The device column: ``'GPU 3 H100 80GB HBM3'`` (nvidia-smi's index, the name without
    its vendor word), ``'cuda:0'`` when the index is unknown, ``'cpu'``, or ``'?'``."""
    if not row.device.startswith("cuda"):
        return row.device or "?"
    label = f"GPU {row.gpu_index}" if row.gpu_index is not None else row.device
    name = row.gpu_name.removeprefix("NVIDIA ").removeprefix("Tesla ")
    return f"{label} {name}".rstrip()


def gpu_path(path):
    """The collectives' path column (``'NCCL'``, ``'staged'``, ``'CUDA IPC'``, ...), or
    ``'—'`` before one ran."""
    return GPU_PATHS.get(path, "—")


def gpu_title(row):
    """The long form, for a tooltip: name, indices, memory, utilisation, path."""
    if not row.device.startswith("cuda"):
        return ""
    where = f"nvidia-smi index {row.gpu_index}, " if row.gpu_index is not None else ""
    text = (f"{row.gpu_name or 'GPU'} ({where}{row.device} in this rank): "
            f"{mem(row.gpu_mem_used)} of {mem(row.gpu_mem_total)} held by this rank")
    if row.gpu_dev_mem_used is not None:
        text += f", {mem(row.gpu_dev_mem_used)} in use by all processes"
    if row.gpu_util is not None:
        text += f", {row.gpu_util:.0f}% busy"
    return text + f"; CUDA collectives: {gpu_path(row.gpu_path)}"
