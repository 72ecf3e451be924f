"""``broadcast_object``: any picklable object from one rank to all, through the numpy API
(no framework tensors), as the elastic state needs it on every Keras backend."""
import io

import numpy as np

import engine_native as _numpy_api
from engine_native import basics
from engine_native.basics import global_process_set

try:
    import cloudpickle as _pickle
except ImportError:  # pragma: no cover - cloudpickle is a dependency of the project
    import pickle as _pickle


def broadcast_object(obj, root_rank=0, name=None, process_set=global_process_set):
    """Serialize ``obj`` on ``root_rank`` (cloudpickle) and return it on every rank."""
    name = name or type(obj).__name__
    is_root = basics.rank() == root_rank
    if is_root:
        buffer = io.BytesIO()
        _pickle.dump(obj, buffer)
        data = np.frombuffer(buffer.getvalue(), dtype=np.uint8).copy()
    size = np.array([data.size if is_root else 0], dtype=np.int64)
    _numpy_api.broadcast_(size, root_rank, name + ".sz", process_set)
    if not is_root:
        data = np.empty(int(size[0]), dtype=np.uint8)
    _numpy_api.broadcast_(data, root_rank, name + ".t", process_set)
    return obj if is_root else _pickle.loads(data.tobytes())
