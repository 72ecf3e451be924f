"""Which GPU a rank uses: the GPUs this process may see (nvidia-smi, an imported torch,
CUDA_VISIBLE_DEVICES) and :func:`pin_gpu`, which gives each local rank one of them.

Part of :mod:`engine_native.gpu`, which re-exports :class:`GpuDevice`,
:func:`visible_devices` and :func:`pin_gpu`; import them from there.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import warnings

__all__ = ["GpuDevice", "visible_devices", "pin_gpu"]


@dataclasses.dataclass
class GpuDevice:
    token: str                      # how CUDA_VISIBLE_DEVICES names it ("3", "GPU-8f7c...")
    index: int | None = None        # nvidia-smi index, when known
    name: str = ""
    memory_bytes: int | None = None
    uuid: str = ""


_sharing_warned = False


def _parse_visible(value: str) -> list:
    """CUDA_VISIBLE_DEVICES tokens; like CUDA, stop at the first invalid one ("-1": none)."""
    out = []
    for token in (t.strip() for t in value.split(",")):
        if token.isdigit() or token.startswith(("GPU-", "MIG-")):
            out.append(token)
        else:
            break
    return out


def _nvidia_smi(environ) -> list | None:
    exe = shutil.which("nvidia-smi", path=environ.get("PATH"))
    if exe is None:
        return None
    try:
        proc = subprocess.run([exe, "--query-gpu=index,uuid,name,memory.total",
                               "--format=csv,noheader,nounits"], check=False,
                              capture_output=True, text=True, timeout=20, env=dict(environ))
    except (OSError, subprocess.TimeoutExpired):
        return None
    if proc.returncode != 0:
        return []  # e.g. "No devices were found", or no driver
    rows = []
    for line in proc.stdout.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) >= 4 and parts[0].isdigit():
            mib = parts[-1]  # "[N/A]" on some boards
            rows.append(GpuDevice(parts[0], int(parts[0]), ", ".join(parts[2:-1]),
                                  int(mib) << 20 if mib.isdigit() else None, parts[1]))
    return rows


def _torch_devices() -> list | None:
    """Devices from an already-imported torch (this initialises CUDA in this process)."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    return [GpuDevice(token=str(i), index=i, name=torch.cuda.get_device_name(i),
                      memory_bytes=torch.cuda.get_device_properties(i).total_memory)
            for i in range(torch.cuda.device_count())]


def visible_devices(environ=None, devices=None) -> tuple:
    """The GPUs this process may use: ``(devices, how)``.

    Physical GPUs come from nvidia-smi (which never initialises CUDA), else from an
    already-imported torch ("torch": CUDA is then initialised and the process can only pin
    with ``set_device``), or from ``devices`` (list of :class:`GpuDevice` or a count; tests).
    CUDA_VISIBLE_DEVICES is then applied as CUDA applies it: listed indices or UUID prefixes,
    up to the first invalid entry. ``how`` names the source, or why the list is empty.
    """
    environ = os.environ if environ is None else environ
    if devices is not None:
        rows, how = ([GpuDevice(str(i), i) for i in range(devices)]
                     if isinstance(devices, int) else list(devices)), "given"
    else:
        rows, how = _nvidia_smi(environ), "nvidia-smi"
        if rows is None:
            rows, how = _torch_devices(), "torch"
            if rows is None:
                return [], "no nvidia-smi on PATH and no imported CUDA-enabled torch"
    if not rows:
        return [], f"{how} lists no GPU"
    if how == "torch" or "CUDA_VISIBLE_DEVICES" not in environ:
        return rows, how  # torch has already applied CUDA_VISIBLE_DEVICES
    out = []
    for token in _parse_visible(environ["CUDA_VISIBLE_DEVICES"]):
        row = _match(rows, token)
        if row is None:
            break
        out.append(dataclasses.replace(row, token=token))
    if not out:
        return [], f"CUDA_VISIBLE_DEVICES={environ['CUDA_VISIBLE_DEVICES']!r} hides every GPU"
    return out, how


def _match(rows, token):
    if token.startswith("MIG-"):  # MIG instances are not listed by --query-gpu
        return GpuDevice(token, name="MIG instance")
    return next((r for r in rows if r.token == token or (
        token.startswith("GPU-") and r.uuid and r.uuid.startswith(token))), None)


def pin_gpu(local_rank: int, local_size: int, *, devices=None, environ=None) -> dict:
    """Give this rank one GPU: local rank ``i`` gets visible GPU ``i % n`` (round robin).

    Call before CUDA is initialised in this process (before the first ``torch.cuda`` call):
    the choice is made by narrowing ``CUDA_VISIBLE_DEVICES`` to that one GPU, so it is
    ``cuda:0`` to every library. When more than one GPU is visible the variable is narrowed;
    with one it is left alone. When ranks outnumber GPUs, ranks share GPUs (warned once): NCCL
    cannot hold two ranks of one communicator on one GPU, so the core's CUDA collectives in a
    process set with such ranks go over CUDA IPC among the ranks of each GPU and NCCL between
    one rank per GPU; the staged path (device -> pinned host -> shm/tcp -> device) where
    neither loads (HVD_GPU_PATH). No GPU: nothing changes.

    Parameters
    ----------
    local_rank, local_size : this rank's position among the ranks of this host.
    devices : list of :class:`GpuDevice` or an int count of physical GPUs, replacing
        discovery (tests); CUDA_VISIBLE_DEVICES still applies.
    environ : mapping to read and update instead of ``os.environ`` (tests).

    Returns
    -------
    dict
        For the dashboard: ``device`` ("cuda:0" or "cpu"), ``gpu_index`` (nvidia-smi index),
        ``visible_devices`` (the entry pinned), ``name``, ``memory_bytes``, ``gpus`` (visible
        count), ``shared`` (another local rank uses this GPU), ``staged`` (ranks of this host
        share GPUs), ``pinned_by``; for "cpu", ``reason``.
    """
    environ = os.environ if environ is None else environ
    if not 0 <= local_rank < max(local_size, 1):
        raise ValueError(f"pin_gpu(): local_rank {local_rank} is outside 0..{local_size - 1}")
    devices, how = visible_devices(environ, devices)
    if not devices:
        return {"device": "cpu", "reason": f"no GPU visible: {how}"}
    n = len(devices)
    slot = local_rank % n
    chosen = devices[slot]
    if how == "torch":
        sys.modules["torch"].cuda.set_device(slot)
        device, pinned_by = f"cuda:{slot}", "torch.cuda.set_device (CUDA already initialised)"
    elif n > 1:
        if "CUDA_VISIBLE_DEVICES" not in environ:
            environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # indices = nvidia-smi's
        environ["CUDA_VISIBLE_DEVICES"] = chosen.token
        device, pinned_by = "cuda:0", "CUDA_VISIBLE_DEVICES"
    else:
        device, pinned_by = "cuda:0", "unchanged (one GPU visible)"
    staged = local_size > n
    if staged:
        _warn_sharing(local_size, devices)
    return {"device": device, "gpu_index": chosen.index, "visible_devices": chosen.token,
            "name": chosen.name, "memory_bytes": chosen.memory_bytes, "gpus": n,
            "shared": len(range(slot, local_size, n)) > 1, "staged": staged,
            "pinned_by": pinned_by}


def _warn_sharing(local_size: int, devices: list) -> None:
    global _sharing_warned
    if _sharing_warned:
        return
    _sharing_warned = True
    n = len(devices)
    plan = "; ".join(f"GPU {d.token} <- local ranks "
                     f"{', '.join(str(r) for r in range(i, local_size, n))}"
                     for i, d in enumerate(devices))
    warnings.warn(f"{local_size} ranks on this host share {n} GPU(s) ({plan}). NCCL needs one "
                  "GPU per rank, so the ranks of a GPU reduce through CUDA IPC and one rank per "
                  "GPU joins NCCL; each GPU's time is divided between its ranks (shared under "
                  "MPS instead). Start at most one rank per GPU for full speed.",
                  RuntimeWarning, stacklevel=3)
