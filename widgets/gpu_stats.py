"""Live numbers of a rank's pinned GPU for the dashboard (engine side, publisher thread).

:class:`GpuStats` turns this process's GPU pin (``hvd_magic.gpu_pinning.pinned()``: which GPU,
its name and size) into the snapshot's ``device`` entry, adding what changes:

- ``util``: the GPU's utilisation in percent (NVML ``nvmlDeviceGetUtilizationRates``);
- ``mem_used``: memory this process holds on it, from NVML's per-process list
  (``nvmlDeviceGetComputeRunningProcesses``, which includes the CUDA context and NCCL's
  buffers), else from torch (``memory_reserved``, the caching allocator) but only when torch
  has already initialised CUDA in this process;
- ``dev_mem_used``: memory in use on the whole GPU by every process (``nvmlDeviceGetMemoryInfo``).

NVML comes from ``pynvml`` (the ``nvidia-ml-py`` package) when it imports. Neither NVML nor the
torch queries create a CUDA context, so reporting never initialises CUDA. Cheap: the NVML handle
is looked up once, the GPU is asked at most once per ``interval_s`` (the publisher runs a few
times a second), and a failing NVML is given up on after its first error, never retried.
"""

import os
import sys
import time


class GpuStats:
    """Callable giving the ``device`` fields of this rank's GPU; ``{}`` for a CPU rank.

    Parameters
    ----------
    pin : dict or None
        The rank's pin (``engine_native.gpu.pin_gpu``'s result as recorded by
        ``hvd_magic.gpu_pinning``): ``device``, ``gpu_index``, ``visible_devices``, ``name``,
        ``memory_bytes``, ``pinned_by``.
    nvml : module, optional
        The NVML binding (default: ``pynvml`` when importable); tests pass a fake.
    interval_s : float
        The GPU is queried at most this often; calls in between return the last numbers.
    """

    def __init__(self, pin, nvml=None, interval_s=1.0, clock=time.monotonic):
        self.pin = dict(pin or {})
        self.interval_s = interval_s
        self.clock = clock
        self.queries = 0  # how often the GPU was actually asked (tests)
        self._nvml = nvml
        self._handle = None
        self._nvml_dead = False
        self._live = {}
        self._at = float("-inf")

    @classmethod
    def for_this_process(cls, **kwargs):
        """Stats for the GPU ``hvd_magic.gpu_pinning`` pinned in this process (if any)."""
        from ..gpu_pinning import pinned
        return cls(pinned(), **kwargs)

    def __call__(self):
        device = str(self.pin.get("device") or "cpu")
        if not device.startswith("cuda"):
            return {}
        out = {"kind": "cuda", "index": int(device.partition(":")[2] or 0)}
        if isinstance(self.pin.get("gpu_index"), int):
            out["gpu"] = self.pin["gpu_index"]
        if self.pin.get("name"):
            out["name"] = str(self.pin["name"])
        if isinstance(self.pin.get("memory_bytes"), int):
            out["mem_total"] = self.pin["memory_bytes"]
        now = self.clock()
        if now - self._at >= self.interval_s:
            self._at = now
            self.queries += 1
            self._live = self._query(out["index"])
        out.update(self._live)
        return out

    # ---- queries -------------------------------------------------------------------------

    def _query(self, ordinal):
        out = {}
        handle = self._nvml_handle()
        if handle is not None:
            nvml = self._nvml
            try:
                mem = nvml.nvmlDeviceGetMemoryInfo(handle)
                out["dev_mem_used"], out["mem_total"] = int(mem.used), int(mem.total)
                out["util"] = int(nvml.nvmlDeviceGetUtilizationRates(handle).gpu)
                pid = os.getpid()
                for proc in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    used = getattr(proc, "usedGpuMemory", None)
                    if proc.pid == pid and isinstance(used, int):
                        out["mem_used"] = used
            except Exception:  # NVMLError, a GPU fallen off the bus: give NVML up
                self._nvml_dead, self._handle = True, None
        if "mem_used" not in out:
            used = _torch_reserved(ordinal)
            if used is not None:
                out["mem_used"] = used
        return out

    def _nvml_handle(self):
        """The NVML handle of the pinned GPU, looked up once (None: no NVML, or not usable)."""
        if self._handle is not None or self._nvml_dead:
            return self._handle
        token = str(self.pin.get("visible_devices") or "")
        index = self.pin.get("gpu_index")
        if "set_device" in str(self.pin.get("pinned_by", "")) or token.startswith("MIG-"):
            self._nvml_dead = True  # a torch ordinal, or a MIG slice: no NVML index to use
            return None
        try:
            nvml = self._nvml
            if nvml is None:
                import pynvml as nvml
            nvml.nvmlInit()
            if token.startswith("GPU-"):
                self._handle = nvml.nvmlDeviceGetHandleByUUID(token)
            elif isinstance(index, int):
                self._handle = nvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = nvml
        except Exception:  # ImportError (no nvidia-ml-py), NVMLError (no driver)
            self._handle = None
        self._nvml_dead = self._handle is None
        return self._handle


def _torch_reserved(ordinal):
    """Bytes torch's allocator holds on ``cuda:ordinal``, only when torch is imported and has
    initialised CUDA already (never imports torch, never initialises CUDA)."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            return int(torch.cuda.memory_reserved(ordinal))
    except Exception:
        pass
    return None


# The core's names for the paths of CUDA collectives (Note [Device path choice]) and how the
# dashboard labels them.
GPU_PATHS = {"nccl": "NCCL", "staged": "staged", "cuda-ipc": "CUDA IPC",
             "cuda-ipc+nccl": "CUDA IPC + NCCL", "local": "local (one rank)"}
# Ranks under an MPS daemon (hvd_magic.launch.mps): the same paths, one shared GPU context.
GPU_PATHS.update({f"{key}/mps": f"{label} under MPS" for key, label in list(GPU_PATHS.items())})


def gpu_path(core_raw):
    """A key of ``GPU_PATHS``: the path of this rank's CUDA collectives, from the core's
    ``metrics()["gpu_paths"]`` (``{set id: {"path", "device"}}``, empty before the first CUDA
    collective). The global set's when it has one, else the lowest set's; None when none ran.
    With ``/mps`` appended when the rank's CUDA runs under an MPS daemon
    (``metrics()["mps_pipe_directory"]``)."""
    paths = core_raw.get("gpu_paths") if isinstance(core_raw, dict) else None
    if not isinstance(paths, dict) or not paths:
        return None
    key = min(paths, key=lambda k: int(k) if str(k).isdigit() else float("inf"))
    entry = paths[key]
    path = entry.get("path") if isinstance(entry, dict) else None
    if path in GPU_PATHS and core_raw.get("mps_pipe_directory"):
        path += "/mps"
    return path if path in GPU_PATHS else None
