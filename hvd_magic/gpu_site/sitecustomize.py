"""Start-up of every Python in an hvdrun rank whose GPU hvd-magic pinned (this folder is first
on its PYTHONPATH; hvd_magic.gpu_pinning.child_env).

A. Load ``hvd_magic/gpu_compat.py`` by its path (importing hvd_magic would cost every Python
   the rank starts ~30 ms) and install it from ``HVD_GPU_PIN``: Horovod's
   ``torch.cuda.set_device(hvd.local_rank())`` then finds the pinned GPU (Note
   [set_device(hvd.local_rank())] there).
B. Run the ``sitecustomize`` this one hides (the next one on sys.path, e.g. a distribution's),
   as ddtrace-run and coverage do, so the interpreter starts as it would without us.

Step A never fails the interpreter (errors are ignored); an error in the hidden sitecustomize
is reported by Python as it would be without us.
"""
import importlib.machinery
import importlib.util
import os
import sys


def _load(name, spec):
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start():
    here = os.path.dirname(os.path.abspath(__file__))
    try:  # step A
        path = os.path.join(os.path.dirname(here), "gpu_compat.py")
        _load("_hvd_gpu_compat", importlib.util.spec_from_file_location("_hvd_gpu_compat", path)
              ).install_from_env()
    except Exception:
        pass
    rest = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)  # step B
    if spec is not None and spec.loader is not None:
        module = _load("sitecustomize", spec)
        sys.modules["sitecustomize"] = module


_start()
