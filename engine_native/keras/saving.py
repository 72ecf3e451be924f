"""``hvd.load_model``: load a saved Keras model with its optimizer wrapped in
DistributedOptimizer (its state, e.g. momentum, restored from the file)."""
import keras

from engine_native.keras.compression import Compression
from engine_native.keras.optimizer import (_DistributedOptimizerMixin, distributed_class,
                                           make_settings)


def _optimizer_classes():
    """Every Keras optimizer class, by the name a saved file records (torch backend: the
    classes keras.optimizers.X instantiates, e.g. torch_sgd.SGD, share X's name)."""
    found, todo = {}, [keras.optimizers.Optimizer]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if issubclass(sub, _DistributedOptimizerMixin):
                continue  # a class this package generated
            todo.append(sub)
            if sub.__module__.startswith("keras.") and not sub.__name__.startswith("_"):
                found.setdefault(sub.__name__, sub)
                if sub.__module__.startswith("keras.src.backend."):
                    found[sub.__name__] = sub  # the backend's class wins over the public one
    return found


def load_model(filepath, custom_optimizers=None, custom_objects=None,
               compression=Compression.none):
    """Load a ``.keras`` model whose optimizer is wrapped in DistributedOptimizer.

    Parameters
    ----------
    filepath : str or path-like
    custom_optimizers : list of optimizer classes, optional
        Optimizer classes of your own that the file may name.
    custom_objects : dict, optional
        Passed on to ``keras.models.load_model``.
    compression : Compression.none or Compression.fp16
        The wrapped optimizer's gradient compression.
    """
    classes = _optimizer_classes()
    classes.update({cls.__name__: cls for cls in custom_optimizers or []})
    wrapped = {name: distributed_class(cls, make_settings(name, compression=compression))
               for name, cls in classes.items()}
    wrapped.update(custom_objects or {})
    return keras.models.load_model(filepath, custom_objects=wrapped)
