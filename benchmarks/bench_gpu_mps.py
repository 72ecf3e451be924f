"""A private MPS daemon for benchmarks/bench_gpu.py's cases whose ranks share the GPU under MPS
(hvd_magic/launch/mps.py, loaded on its own: the GPU machine may lack the driver-side packages
that importing hvd_magic pulls in)."""
import contextlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def _mps_module():
    """hvd_magic/launch/mps.py on its own (it needs the standard library only): importing the
    hvd_magic package would need its driver-side dependencies (cloudpickle, IPython), which
    the GPU machine may lack. A stand-in package over the launch folder, whose ``__init__``
    never runs, lets its relative import of procfs.py resolve to the file."""
    import importlib
    import types
    package = "hvd_mps_for_bench"
    if package not in sys.modules:
        stand_in = types.ModuleType(package)
        stand_in.__path__ = [os.path.join(os.path.dirname(HERE), "hvd_magic", "launch")]
        sys.modules[package] = stand_in
    return importlib.import_module(package + ".mps")


@contextlib.contextmanager
def under_mps():
    """A private MPS daemon for the ranks spawned inside (they inherit its variables from
    os.environ); stopped, and the variables removed, on the way out. Yields the daemon."""
    daemon = _mps_module().MpsDaemon()
    added = daemon.start()
    saved = {k: os.environ.get(k) for k in added}
    os.environ.update(added)
    try:
        yield daemon
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        daemon.stop()
