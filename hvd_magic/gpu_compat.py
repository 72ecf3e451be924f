"""Horovod's ``torch.cuda.set_device(hvd.local_rank())`` in a rank whose GPU was pinned.

Note [set_device(hvd.local_rank())]
Pinning (:mod:`hvd_magic.gpu_pinning`) narrows ``CUDA_VISIBLE_DEVICES`` to the rank's GPU, so
that GPU is ``cuda:0`` and code that names no device (``model.cuda()``, ``torch.randn(...,
device="cuda")``) lands on it without initialising CUDA at start. Horovod's documentation tells
users to write ``torch.cuda.set_device(hvd.local_rank())`` instead; in a narrowed rank of local
rank k > 0 that ordinal does not exist and CUDA would raise "invalid device ordinal". So, in
ranks that hvd-magic pinned, ``torch.cuda.set_device`` maps exactly one ordinal -- this rank's
local rank -- to 0 when it is not a visible device; every other call passes through unchanged
(an ordinal that exists is used as given, one that does not still raises). Only ``set_device``
is mapped: an ordinal written elsewhere (``torch.device("cuda", hvd.local_rank())``) is not;
write ``"cuda"`` or ``torch.cuda.current_device()`` there.

The mapping is installed without importing torch: a meta-path finder patches ``torch.cuda``
right after the user's ``import torch`` loads it (or at once when torch is already loaded).
Ranks run in our own processes (engines, ``hvd_magic.run`` tasks) call :func:`install`;
``hvdrun``'s ranks run foreign commands and get it from ``gpu_site/sitecustomize.py``.

This module imports only the standard library and nothing of hvd_magic: that sitecustomize
loads it by file path in every Python process of a pinned hvdrun rank.
"""

from __future__ import annotations

import functools
import importlib.abc
import json
import os
import sys

# Set by whoever pinned a rank, in that rank's environment (JSON: the pin_gpu result plus
# "local_rank"). Launchers never pass it on (launch/config.py strips it).
PIN_ENV = "HVD_GPU_PIN"
_MARK = "_hvd_pinned_local_rank"


def pin_from_env(environ=None) -> dict | None:
    """The pin recorded in ``environ`` (default os.environ), or None."""
    raw = (os.environ if environ is None else environ).get(PIN_ENV)
    if not raw:
        return None
    try:
        pin = json.loads(raw)
    except ValueError:
        return None
    return pin if isinstance(pin, dict) else None


def install_from_env(environ=None) -> bool:
    """:func:`install` for the rank recorded in ``environ``, when that pin narrowed
    ``CUDA_VISIBLE_DEVICES``. Returns whether the mapping is (now) installed."""
    pin = pin_from_env(environ)
    if not pin or not pin.get("narrowed") or not isinstance(pin.get("local_rank"), int):
        return False
    install(pin["local_rank"])
    return True


def install(local_rank: int) -> None:
    """Map ``torch.cuda.set_device(local_rank)`` to device 0 in this process (see the note)."""
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and hasattr(cuda, "set_device"):
        patch(cuda, local_rank)
        return
    # by class name: sitecustomize loads a second copy of this module by path
    if not any(type(f).__name__ == "_PatchTorchCuda" for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchTorchCuda(local_rank))


def _index(device) -> int | None:
    """The ordinal ``set_device`` would use: an int, ``"cuda:3"`` / ``"3"``, a torch.device."""
    if isinstance(device, bool):
        return None
    if isinstance(device, int):
        return device
    if isinstance(device, str):
        text = device.rpartition(":")[2] if device.startswith("cuda") else device
        return int(text) if text.isdigit() else None
    index = getattr(device, "index", None)
    return index if getattr(device, "type", "cuda") == "cuda" and isinstance(index, int) else None


def patch(cuda, local_rank: int) -> None:
    """Wrap ``cuda.set_device`` (idempotent)."""
    original = cuda.set_device
    if getattr(original, _MARK, None) is not None:
        return

    @functools.wraps(original)
    def set_device(device):
        index = _index(device)
        if index is not None and index == local_rank > 0 and index >= cuda.device_count():
            return original(0)  # this rank's pinned GPU, visible as 0 (Note above)
        return original(device)

    setattr(set_device, _MARK, local_rank)
    cuda.set_device = set_device


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, local_rank):
        self.loader, self.local_rank = loader, local_rank

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        patch(module, self.local_rank)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...
        return getattr(self.loader, name)


class _PatchTorchCuda(importlib.abc.MetaPathFinder):
    """Finds ``torch.cuda`` through the other finders and patches it once it has loaded."""

    def __init__(self, local_rank: int):
        self.local_rank = local_rank
        self.searching = False  # another finder that asks the others (as this one does) asks
        # us again: answer None then, or the two recurse (imports of one name hold its lock)

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch.cuda" or self.searching:
            return None
        self.searching = True
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None) if finder is not self else None
                spec = find(fullname, path, target) if find is not None else None
                if spec is not None and spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, self.local_rank)
                    return spec
            return None
        finally:
            self.searching = False
