"""``hvd.DistributedGradientTape``: a ``tf.GradientTape`` whose ``gradient()`` returns the
gradients averaged over the ranks (Horovod's, same arguments).

All dense gradients of one ``gradient()`` call are reduced as ONE grouped allreduce (one
negotiation, fused in the core, one ``tf.numpy_function`` inside ``tf.function``), unless
``groups`` asks for several groups. Sparse gradients (IndexedSlices) are allgathered, or
densified first with ``sparse_as_dense=True``.
"""
from __future__ import annotations

import warnings

import tensorflow as tf

from engine_native._dtypes import Average
from engine_native.basics import global_process_set
from engine_native.group_split import index_groups
from engine_native.tensorflow import graph
from engine_native.tensorflow.compression import Compression
from engine_native.tensorflow.mpi_ops import check_call, grouped_allreduce


def check_groups(num_groups, groups):
    """``groups`` (or the deprecated ``num_groups``, with Horovod's warning), checked."""
    if num_groups != 0:
        warnings.warn('Parameter `num_groups` has been replaced by `groups` '
                      'and will be removed in v0.23.0.', DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is not None and not (isinstance(groups, list) or
                                   (isinstance(groups, int) and groups > 0)):
        raise ValueError('groups should be a non-negative integer or '
                         'a list of list of tf.Variable.')
    return groups


class _GradientReducer:
    """What ``gradient()`` does with the local gradients: the tape's Horovod arguments, and
    the sources whose gradients stay local (``register_local_source`` of the tape,
    ``register_local_var`` of the TF1 optimizer)."""

    def __init__(self, compression, sparse_as_dense, op, gradient_predivide_factor, groups,
                 process_set, caller="DistributedGradientTape.gradient",
                 scale_local_gradients=True):
        self.local_sources = {}  # by id: Keras 3 variables have no ref()
        self.scale_local_gradients = scale_local_gradients
        self.compression = compression
        self.sparse_as_dense = sparse_as_dense
        self.op = op
        # Average splits over the two factors: the core divides by the set size as well.
        self.prescale = 1.0 / gradient_predivide_factor if op == Average else 1.0
        self.postscale = gradient_predivide_factor if op == Average else 1.0
        self.groups = groups
        self.process_set = process_set
        self.caller = caller  # what argument errors name

    def _index_groups(self, grads, sources):
        """Lists of gradient positions, each reduced as one grouped allreduce."""
        present = [i for i, g in enumerate(grads) if g is not None]
        return index_groups(self.groups, present, {id(s): i for i, s in enumerate(sources)})

    def register_local(self, source):
        """Keep ``source``'s gradient this rank's (reduce_shared)."""
        self.local_sources[id(source)] = source

    def reduce_shared(self, grads, sources):
        """``reduce`` of every gradient but those of local sources, which stay this rank's:
        divided by the set size when ``scale_local_gradients`` (Horovod's rule)."""
        local = [id(s) in self.local_sources for s in sources]
        shared = [i for i, is_local in enumerate(local) if not is_local]
        out = list(grads)
        reduced = self.reduce([grads[i] for i in shared], [sources[i] for i in shared])
        for i, grad in zip(shared, reduced):
            out[i] = grad
        if self.scale_local_gradients and self.local_sources:
            n = float(self.process_set.size())
            for i, is_local in enumerate(local):
                g = out[i]
                if is_local and g is not None:
                    out[i] = (tf.IndexedSlices(g.values / n, g.indices, g.dense_shape)
                              if isinstance(g, tf.IndexedSlices) else g / n)
        return out

    def reduce(self, grads, sources):
        check_call(self.caller, self.process_set, self.op)
        if not self.process_set.included() or self.process_set.size() == 1:
            return grads  # Horovod's _allreduce_cond: nothing to combine
        if self.sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        reduced = list(grads)
        with graph.in_order():  # TF1: the groups one at a time (Note [TF1 graphs])
            for group in self._index_groups(grads, sources):
                values = grouped_allreduce(
                    [grads[i] for i in group], compression=self.compression, op=self.op,
                    prescale_factor=self.prescale, postscale_factor=self.postscale,
                    process_set=self.process_set)
                for i, value in zip(group, values):
                    reduced[i] = value
        return reduced


class _DistributedTape:
    """Mixed into the wrapped tape's own class, so ``isinstance(tape, tf.GradientTape)`` and
    any subclass behaviour stay."""

    def register_local_source(self, source):
        """Keep ``source``'s gradient local (not reduced); scaled by 1/size when
        ``scale_local_gradients`` (Horovod's rule)."""
        self._hvd_reducer.register_local(source)

    def gradient(self, target, sources, output_gradients=None, use_generic_names=False,
                 **kwargs):
        grads = super().gradient(target, sources, output_gradients, **kwargs)
        flat_grads = self._hvd_reducer.reduce_shared(tf.nest.flatten(grads),
                                                     tf.nest.flatten(sources))
        return tf.nest.pack_sequence_as(grads, flat_grads)


def DistributedGradientTape(gradtape, device_dense='', device_sparse='',
                            compression=Compression.none, sparse_as_dense=False, op=Average,
                            gradient_predivide_factor=1.0, num_groups=0, groups=None,
                            process_set=global_process_set, scale_local_gradients=True):
    """Wrap ``gradtape`` so that ``gradient()`` reduces the gradients over the ranks.

    Parameters
    ----------
    gradtape : tf.GradientTape
        Wrapped after its ``with`` block (or before: the new tape is then the one to enter).
    compression : hvd.Compression.none or .fp16
    sparse_as_dense : bool
        Densify IndexedSlices gradients and allreduce them with the others.
    op : hvd.Average (default), hvd.Sum, hvd.Adasum, ...
    gradient_predivide_factor : float
        With Average: scale by 1/f before the sum and f/size after it.
    groups : int or list of lists of tf.Variable, optional
        Default: every gradient in one group. An int n: n groups of consecutive gradients;
        lists: those variables' gradients together, each other gradient alone.
    process_set : hvd.ProcessSet
    scale_local_gradients : bool
        Divide the gradients of ``register_local_source`` sources by the set size.

    Example
    -------
    >>> with tf.GradientTape() as tape:
    ...     loss = loss_fn(model(x), y)
    >>> tape = hvd.DistributedGradientTape(tape)
    >>> grads = tape.gradient(loss, model.trainable_variables)
    """
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError('gradient_predivide_factor not supported with op != Average')
    groups = check_groups(num_groups, groups)
    cls = type(type(gradtape).__name__, (_DistributedTape, type(gradtape)), {})
    tape = cls.__new__(cls)
    tape.__dict__.update(gradtape.__dict__)  # the same recording (its _tape), persistence, ...
    tape._hvd_reducer = _GradientReducer(compression, sparse_as_dense, op,
                                         gradient_predivide_factor, groups, process_set,
                                         scale_local_gradients=scale_local_gradients)
    return tape
