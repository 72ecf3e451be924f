"""Stand-ins for GPU pinning tests on machines without a GPU (importable from every test folder:
tests/ is on sys.path through its conftest.py).

- :func:`fake_smi`: an ``nvidia-smi`` listing N GPUs, for PATH (the discovery pin_gpu uses).
- :func:`cuda_tracer`: a folder with a ``sitecustomize.py`` that records every call a process
  makes to the torch.cuda functions that find, pin or initialise a GPU (``torch.cuda.
  _hvd_touched``); put it on PYTHONPATH of the processes to watch, or call :func:`trace_cuda`
  on an imported torch in this process.
- :func:`fake_torch`: a folder with a tiny ``torch`` package whose ``torch.cuda.set_device``
  records its argument and whose ``device_count()`` is ``FAKE_TORCH_GPUS`` (default 1).
- :class:`FakeNvml`: the pynvml calls GpuStats makes, with numbers the test sets.
"""
import os
import stat
import textwrap
import types

# What finds, pins or initialises a GPU in torch.cuda (the old engine pinning called the first
# five); none may run in a CPU-only rank.
TRACED = ("is_available", "device_count", "set_device", "get_device_name",
          "get_device_properties", "_lazy_init", "init", "current_device", "mem_get_info")


def fake_smi(folder, count: int, name: str = "NVIDIA Fake A100", mib: int = 40960) -> str:
    """Write ``folder/nvidia-smi`` listing ``count`` GPUs; returns ``folder`` (for PATH)."""
    os.makedirs(folder, exist_ok=True)
    rows = "".join(f"echo '{i}, GPU-{i:04d}-fake, {name}, {mib}'\n" for i in range(count))
    exe = os.path.join(folder, "nvidia-smi")
    with open(exe, "w") as fh:
        fh.write("#!/bin/sh\n" + (rows or "echo 'No devices were found'; exit 6\n"))
    os.chmod(exe, os.stat(exe).st_mode | stat.S_IEXEC)
    return str(folder)


def trace_cuda(cuda, monkeypatch=None) -> list:
    """Record calls to the TRACED functions of ``cuda`` (torch.cuda) in the returned list
    (also ``cuda._hvd_touched``). Calls still go through."""
    touched = []
    for name in TRACED:
        original = getattr(cuda, name, None)
        if original is None:
            continue

        def traced(*args, _name=name, _original=original, **kwargs):
            touched.append(_name)
            return _original(*args, **kwargs)
        if monkeypatch is not None:
            monkeypatch.setattr(cuda, name, traced)
        else:
            setattr(cuda, name, traced)
    cuda._hvd_touched = touched
    return touched


_TRACER = '''
"""Test tracer: records torch.cuda calls in torch.cuda._hvd_touched (tests/gpu_fakes.py)."""
import importlib.abc
import sys

sys.path.append({tests!r})


class _Loader(importlib.abc.Loader):
    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        import gpu_fakes
        gpu_fakes.trace_cuda(module)

    def __getattr__(self, name):
        return getattr(self.loader, name)


class _Trace(importlib.abc.MetaPathFinder):
    searching = False

    def find_spec(self, name, path=None, target=None):
        if name != "torch.cuda" or self.searching:
            return None
        self.searching = True
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None) if finder is not self else None
                spec = find(name, path, target) if find else None
                if spec is not None and spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                    return spec
            return None
        finally:
            self.searching = False


sys.meta_path.insert(0, _Trace())
'''


def cuda_tracer(folder) -> str:
    """Write the tracer's ``sitecustomize.py`` into ``folder``; returns ``folder``."""
    os.makedirs(folder, exist_ok=True)
    tests = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(folder, "sitecustomize.py"), "w") as fh:
        fh.write(_TRACER.format(tests=tests))
    return str(folder)


def fake_torch(folder) -> str:
    """Write a tiny ``torch`` package into ``folder``; returns ``folder``."""
    pkg = os.path.join(folder, "torch")
    os.makedirs(pkg, exist_ok=True)
    with open(os.path.join(pkg, "__init__.py"), "w") as fh:
        fh.write("from . import cuda\n")
    with open(os.path.join(pkg, "cuda.py"), "w") as fh:
        fh.write(textwrap.dedent('''\
            import os
            calls = []

            def set_device(device):
                calls.append(device)

            def device_count():
                return int(os.environ.get("FAKE_TORCH_GPUS", "1"))
            '''))
    return str(folder)


class FakeNvml:
    """pynvml as GpuStats uses it; ``calls`` counts every function call."""

    class NVMLError(Exception):
        pass

    def __init__(self, used=3 << 30, total=80 << 30, util=87, procs=(), broken=None):
        self.used, self.total, self.util, self.procs = used, total, util, list(procs)
        self.broken = broken  # a function name that raises NVMLError
        self.calls = []

    def _call(self, name):
        self.calls.append(name)
        if name == self.broken:
            raise self.NVMLError(f"{name} failed")

    def nvmlInit(self):
        self._call("nvmlInit")

    def nvmlDeviceGetHandleByIndex(self, index):
        self._call("nvmlDeviceGetHandleByIndex")
        return ("index", index)

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self._call("nvmlDeviceGetHandleByUUID")
        return ("uuid", uuid)

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._call("nvmlDeviceGetMemoryInfo")
        return types.SimpleNamespace(used=self.used, total=self.total, free=self.total - self.used)

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._call("nvmlDeviceGetUtilizationRates")
        return types.SimpleNamespace(gpu=self.util, memory=10)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self._call("nvmlDeviceGetComputeRunningProcesses")
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=used) for pid, used in self.procs]
