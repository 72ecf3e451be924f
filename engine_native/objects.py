"""``broadcast_object`` and ``allgather_object``: any picklable object between ranks, as
Horovod's bindings offer them, for every binding (torch, tensorflow, keras, jax) — serialized
with cloudpickle and moved as uint8 arrays through the NumPy API, so no framework tensor is
involved (the elastic states and the optimizers' scalar state use them on every backend).
"""
from __future__ import annotations

import numpy as np

from engine_native import basics, numpy_ops
from engine_native.basics import global_process_set

try:
    import cloudpickle as _pickle
except ImportError:  # pragma: no cover - cloudpickle is a dependency of the project
    import pickle as _pickle


def _to_bytes(obj) -> np.ndarray:
    return np.frombuffer(_pickle.dumps(obj), dtype=np.uint8)


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """``root_rank``'s ``obj`` on every rank (``obj`` is ignored on the others).

    ``name`` is the base name of the two broadcasts (``<name>.sz``, ``<name>.t``; default the
    type's name); ``root_rank`` is a global rank of ``process_set``."""
    name = name or type(obj).__name__
    is_root = basics.rank() == root_rank
    data = _to_bytes(obj).copy() if is_root else None
    size = np.array([data.size if is_root else 0], dtype=np.int64)
    numpy_ops.broadcast_(size, root_rank, name + ".sz", process_set)
    if not is_root:
        data = np.empty(int(size[0]), dtype=np.uint8)
    numpy_ops.broadcast_(data, root_rank, name + ".t", process_set)
    return obj if is_root else _pickle.loads(data.tobytes())


def allgather_object(obj, name=None, process_set=global_process_set):
    """Every rank's ``obj``, as a list indexed by rank within ``process_set``."""
    name = name or type(obj).__name__
    data = _to_bytes(obj)
    sizes = numpy_ops.allgather(np.array([data.size], np.int64), name + ".sz", process_set)
    gathered = numpy_ops.allgather(data, name + ".t", process_set)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    return [_pickle.loads(gathered[offsets[i]:offsets[i + 1]].tobytes())
            for i in range(len(sizes))]
