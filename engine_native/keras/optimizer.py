"""``hvd.DistributedOptimizer`` for Keras 3: the wrapped optimizer averages its gradients
across ranks before it applies them.

Note [Where the allreduce runs]. Keras 3's ``Optimizer.apply(grads, variables)`` (also reached
through ``apply_gradients`` and, on jax, ``stateless_apply``) calls ``_clip_gradients(grads)``
once per update, with the gradients it is about to apply and before clipping, on every backend
and under ``model.fit``'s compiled steps too. The generated class reduces the whole list
there, as one grouped allreduce (one negotiation, fused in the core), then lets the base class
clip. ``backward_passes_per_step=N`` is Keras's own ``gradient_accumulation_steps=N``: the
optimizer sums N steps' gradients locally and reaches ``_clip_gradients`` only on every N-th
(tf and torch: inside ``ops.cond``; jax runs it every step and keeps the result of the N-th
only, so the allreduce sits in a ``lax.cond`` of its own), with the accumulated mean, which
the allreduce scales back to a sum unless ``average_aggregated_gradients``.

``groups=`` splits the list into several grouped allreduces (``gradient_groups``); which
gradient is whose variable comes from ``_backend_apply_gradients(grads, variables)``, the
call that leads to ``_clip_gradients`` with the same (filtered) list, on every backend.

As in Horovod, the generated class takes the base class's name and module, so a saved model
loads without engine_native; :func:`engine_native.keras.load_model` wraps it again.
"""
from __future__ import annotations

import dataclasses
import warnings

import keras

from engine_native._dtypes import Average, Sum
from engine_native.basics import ProcessSet, global_process_set
from engine_native.keras import backend_glue, gradient_groups
from engine_native.keras.compression import Compression


@dataclasses.dataclass(frozen=True)
class _Settings:
    name: str
    compression: type
    op: int
    gradient_predivide_factor: float
    backward_passes_per_step: int
    average_aggregated_gradients: bool
    process_set: ProcessSet
    groups: object = None  # None, a positive int or gradient_groups.VariableGroups


class _DistributedOptimizerMixin:
    """Placed before the user's optimizer class in the generated class's bases."""
    _hvd_settings: _Settings = None

    def _backend_apply_gradients(self, grads, trainable_variables):
        # The variables of the gradients _clip_gradients will get, for the groups. Set past
        # Keras's attribute tracking, which would adopt model variables as the optimizer's.
        object.__setattr__(self, "_hvd_variables", tuple(trainable_variables))
        return super()._backend_apply_gradients(grads, trainable_variables)

    def _clip_gradients(self, grads):
        grads = list(grads)
        steps = self.gradient_accumulation_steps
        if steps and backend_glue.backend_name() == "jax":
            import jax
            is_update_step = (self._iterations + 1) % steps == 0
            grads = jax.lax.cond(is_update_step, self._hvd_allreduce, lambda g: list(g), grads)
        else:
            grads = self._hvd_allreduce(grads)
        return super()._clip_gradients(grads)

    def _hvd_allreduce(self, grads):
        settings = self._hvd_settings
        op, prescale, postscale = settings.op, 1.0, 1.0
        if settings.gradient_predivide_factor != 1.0 and op == Average:
            # Horovod's split of the average: 1/f before the sum, f/size after it
            op, prescale = Sum, 1.0 / settings.gradient_predivide_factor
            postscale = settings.gradient_predivide_factor / settings.process_set.size()
        if settings.backward_passes_per_step > 1 and not settings.average_aggregated_gradients:
            postscale *= settings.backward_passes_per_step  # Keras passes the mean of the N
        compressed, contexts = zip(*[settings.compression.compress(g) for g in grads])
        groups = gradient_groups.split(settings.groups, len(grads),
                                       getattr(self, "_hvd_variables", None),
                                       self._trainable_variables)
        reduced = [None] * len(grads)
        for k, members in enumerate(groups):
            name = settings.name if settings.groups is None else f"{settings.name}.group{k}"
            out = backend_glue.grouped_allreduce([compressed[i] for i in members], op, prescale,
                                                 postscale, settings.process_set, name=name)
            for i, tensor in zip(members, out):
                reduced[i] = tensor
        return [settings.compression.decompress(g, ctx) for g, ctx in zip(reduced, contexts)]


_classes: dict = {}  # (base class, settings) -> generated class


def distributed_class(base: type, settings: _Settings) -> type:
    """The class of ``base`` optimizers that reduce their gradients with ``settings``."""
    key = (base, settings)
    if key not in _classes:
        if not hasattr(base, "_clip_gradients"):
            raise TypeError(f"DistributedOptimizer: {base.__name__} has no _clip_gradients(); "
                            f"this needs a Keras 3 optimizer (keras>=3.12), got {base!r}")
        _classes[key] = type(base.__name__, (_DistributedOptimizerMixin, base),
                             {"__module__": base.__module__,
                              "__qualname__": base.__qualname__,
                              "_hvd_settings": settings})
    return _classes[key]


def make_settings(optimizer_name, compression=Compression.none, gradient_predivide_factor=1.0,
                  op=Average, backward_passes_per_step=1, average_aggregated_gradients=False,
                  process_set=global_process_set, name=None, groups=None) -> _Settings:
    if op not in (Average, Sum):
        raise ValueError("DistributedOptimizer: op currently only supports Average and Sum")
    if int(backward_passes_per_step) < 1:
        raise ValueError(f"DistributedOptimizer: backward_passes_per_step must be >= 1, got "
                         f"{backward_passes_per_step}")
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("DistributedOptimizer: gradient_predivide_factor needs op=Average")
    # always named: inside jax.jit an unnamed op takes its name from the trace order
    # (engine_native.jax, Note [Traced names]), which a rank that retraced would shift
    return _Settings(name or f"Distributed{optimizer_name}", compression, op,
                     float(gradient_predivide_factor), int(backward_passes_per_step),
                     bool(average_aggregated_gradients), process_set,
                     gradient_groups.check(groups))


def DistributedOptimizer(optimizer, name=None, device_dense='', device_sparse='',
                         compression=Compression.none, sparse_as_dense=False,
                         gradient_predivide_factor=1.0, op=Average, backward_passes_per_step=1,
                         average_aggregated_gradients=False, num_groups=0, groups=None,
                         process_set=global_process_set):
    """An optimizer that averages gradients across ranks before applying them.

    Returns a new optimizer of a generated subclass of ``type(optimizer)``, built from
    ``optimizer.get_config()`` (as Horovod's: wrap before training, then compile with it).

    Parameters
    ----------
    optimizer : keras.optimizers.Optimizer
        The optimizer to wrap (not already wrapped).
    name : str, optional
        Name of the gradients' grouped allreduce (default ``Distributed<Optimizer>``).
    device_dense, device_sparse, sparse_as_dense :
        Accepted for Horovod compatibility; Keras 3 gradients are dense and reduced where
        they are (host tensors; CUDA torch tensors through engine_native.torch).
    compression : Compression.none or Compression.fp16
    gradient_predivide_factor : float
        Scale by ``1/f`` before the sum and ``f/size`` after it (op=Average only).
    op : Average or Sum
    backward_passes_per_step : int
        Accumulate this many steps' gradients locally; allreduce and apply on every N-th.
    average_aggregated_gradients : bool
        Divide the accumulated gradients by ``backward_passes_per_step`` (default: sum).
    num_groups : int
        Deprecated (as in Horovod): used as ``groups`` when that is None.
    groups : int or list of lists of keras.Variable, optional
        None: one grouped allreduce of every gradient. k > 0: k groups of consecutive
        gradients (sizes differing by at most one). Lists: each list one group; a variable
        in none of them is a group of its own. Each group is one grouped allreduce, run one
        after the other (engine_native.keras.gradient_groups).
    process_set : ProcessSet
        Reduce over these ranks only.

    Example
    -------
    >>> opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
    >>> model.compile(optimizer=opt, loss="mse")
    """
    if isinstance(optimizer, _DistributedOptimizerMixin):
        raise ValueError(f"DistributedOptimizer: {type(optimizer).__name__} is already a "
                         f"DistributedOptimizer; wrap the original optimizer once")
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(f"DistributedOptimizer: expected a keras.optimizers.Optimizer, got "
                        f"{type(optimizer).__name__}")
    if num_groups:
        warnings.warn("DistributedOptimizer: num_groups is deprecated (as in Horovod); use "
                      "groups", DeprecationWarning, stacklevel=2)
        groups = num_groups if groups is None else groups
    settings = make_settings(type(optimizer).__name__, compression, gradient_predivide_factor,
                             op, backward_passes_per_step, average_aggregated_gradients,
                             process_set, name, groups)
    config = optimizer.get_config()
    if settings.backward_passes_per_step > 1:
        if config.get("gradient_accumulation_steps"):
            raise ValueError("DistributedOptimizer: the optimizer already accumulates "
                             "gradients (gradient_accumulation_steps="
                             f"{config['gradient_accumulation_steps']}); pass "
                             "backward_passes_per_step=1 or an optimizer without it")
        config["gradient_accumulation_steps"] = settings.backward_passes_per_step
    return distributed_class(type(optimizer), settings).from_config(config)
