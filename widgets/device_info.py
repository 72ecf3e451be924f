"""The device a rank's snapshot names (its ``device`` field): ``{"kind": "cpu"}`` or the CUDA
device with its name, memory and the path the core's CUDA collectives take. Called by the
engine's publisher thread (:mod:`.publisher`); it never initialises CUDA or imports torch.
"""

import sys

from .gpu_stats import gpu_path


def device_info(device, core_raw, gpu=None):
    """``{"kind": "cpu"}`` or the CUDA device with its name and this process's memory.

    ``gpu`` (a :class:`.gpu_stats.GpuStats`) gives this rank's pinned GPU with live numbers
    (utilisation, memory); otherwise ``device`` is ``"cuda:k"``, or a dict with what the magic
    learnt when it pinned the GPU (``{"device": "cuda:k", "name": ..., "mem_total": bytes}``),
    and live memory comes from torch only when it is already imported and CUDA already
    initialised. Either way this thread never initialises CUDA or imports torch. ``path``: the
    path the core's CUDA collectives take (``metrics()["gpu_paths"]``), once one ran."""
    try:
        out = dict(gpu()) if gpu is not None else {}
    except Exception:  # a GPU query must never stop the publisher
        out = {}
    if not out:
        out = known_device(device, core_raw)
    if out.get("kind") == "cuda":
        path = gpu_path(core_raw)
        if path:
            out["path"] = path
    return out


def known_device(device, core_raw):
    known = dict(device) if isinstance(device, dict) else {}
    if known:
        device = known.get("device")
    if device is None and isinstance(core_raw, dict) and isinstance(core_raw.get("device"), int):
        device = f"cuda:{core_raw['device']}" if core_raw["device"] >= 0 else "cpu"
    if not device or not str(device).startswith("cuda"):
        return {"kind": "cpu"}
    index = int(str(device).partition(":")[2] or 0)
    out = {"kind": "cuda", "index": index}
    out.update({k: known[k] for k in ("name", "mem_total") if known.get(k) is not None})
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            props = torch.cuda.get_device_properties(index)
            out.update(name=props.name, mem_total=int(props.total_memory),
                       mem_used=int(torch.cuda.memory_reserved(index)))
    except Exception:  # a GPU query must never stop the publisher
        pass
    return out
