"""Paths that have never run on real hardware warn once per process when first used (issue
#39 item 6), until a device run proves them and their entry here is removed.

The CPU tests drive these paths against the fake CUDA runtime and NCCL (DESIGN §8), which
checks their control flow, not what a real driver does with them. A user on such a path
deserves to know that it is the first. The core's own paths of this kind — a mixed process
set (CUDA IPC within each GPU, NCCL between GPUs), a process set of one rank with CUDA tensors
(device copies), a synchronous CUDA op's completion polled by its waiting thread — log their
warnings from the core (runtime/device_executor.cc), once per process as well.
"""
from __future__ import annotations

import os
import sys
import threading
import warnings

PATHS = {
    "cuda-p2p-ipc": "engine_native.torch point-to-point: CUDA tensors between ranks of one "
                    "host go by CUDA IPC (the core's exported staging memory)",
    "cuda-p2p-staged": "engine_native.torch point-to-point: CUDA tensors to another host (or "
                       "with HVD_GPU_PATH=staged) are copied through host memory",
    "cuda-sparse": "engine_native.torch: sparse gradients on CUDA are allreduced as one "
                   "packed device allgather per values dtype",
}

_lock = threading.Lock()  # two threads' first uses warn once, not twice
_warned: set[str] = set()
_PACKAGE = os.path.dirname(os.path.abspath(__file__)) + os.sep


def warn(path: str) -> bool:
    """Warn (RuntimeWarning) the first time ``path`` is used in this process; True if this
    call warned. The warning names the user's line: the first caller outside engine_native."""
    if path in _warned:  # every later use: a set lookup, no lock (the set only grows)
        return False
    with _lock:
        if path in _warned:
            return False
        _warned.add(path)
    warnings.warn(f"{PATHS[path]}; this path has not yet been verified on a GPU "
                  "(tested only against a fake CUDA runtime)", RuntimeWarning,
                  stacklevel=_user_stacklevel())
    return True


def _user_stacklevel() -> int:
    """warnings.warn's stacklevel, called from warn(), of the first frame outside this
    package (Python 3.12's skip_file_prefixes, by hand)."""
    frame, level = sys._getframe(2), 2  # warn()'s caller
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level
