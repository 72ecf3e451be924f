"""``broadcast_object``: any picklable object from one rank to all (engine_native.objects: the
NumPy API, no framework tensors), as the elastic state needs it on every Keras backend."""
from engine_native.objects import broadcast_object  # noqa: F401
