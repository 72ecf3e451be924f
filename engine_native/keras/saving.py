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
            if issubclass(sub, keras.optimizers.LossScaleOptimizer):
                continue  # it hands the gradients to its inner optimizer: that one is wrapped
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
    model = keras.models.load_model(filepath, custom_objects=wrapped)
    _wrap_loaded_optimizer(model, compression)
    return model


def _wrap_loaded_optimizer(model, compression) -> None:
    """Make the loaded ``model.optimizer`` a DistributedOptimizer where ``custom_objects`` did
    not: Keras 3 looks custom objects up by the file's ``registered_name``, which it records
    for a backend's own optimizer class (torch: ``torch_sgd.SGD``) but not for a public one
    (``keras.optimizers.SGD`` on jax and tensorflow), which it takes from its own API table.
    The loaded object becomes an instance of the generated subclass, which adds methods and
    a class attribute only, so the state the file restored (iterations, momentum) is kept
    as it is."""
    optimizer = getattr(model, "optimizer", None)
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        # (a mixed-precision model) its apply() goes to the inner optimizer, whose
        # _clip_gradients is where the gradients are averaged: wrapping the outer one would
        # train every rank on its own gradients, with no error
        optimizer = optimizer.inner_optimizer
    if optimizer is None or isinstance(optimizer, _DistributedOptimizerMixin):
        return
    base = type(optimizer)
    object.__setattr__(optimizer, "__class__", distributed_class(
        base, make_settings(base.__name__, compression=compression)))
