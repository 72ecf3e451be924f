"""Collectives of ``engine_native.tensorflow`` on tf.Tensor / tf.Variable (and IndexedSlices for
allreduce), with the signatures, defaults and return types of Horovod 0.28's
``horovod.tensorflow``.

Each function checks its arguments while Python runs (eagerly, or once while ``tf.function``
traces), then hands a NumPy function over ``engine_native.numpy_ops`` to ``graph.run``, which
calls it at once (eager) or from a stateful ``tf.numpy_function`` (graph). Eagerly and in
``tf.function``, unnamed ops take their name from the numpy API's counter when they run, which
is the same on every rank because every rank runs them in program order; in a tf.compat.v1
graph every op takes a name from the graph when it is built (Note [TF1 graphs] in graph.py).

Gradients (autodiff.py) are Horovod 0.28's registered ones: allreduce -> allreduce of the
gradient with the same op and scale factors; allgather -> Average allreduce of the gradient,
then this rank's rows; broadcast -> Average allreduce of the gradient on the root, zeros
elsewhere; alltoall -> alltoall of the gradient back with the received splits; reducescatter
-> allgather of the gradient times prescale * postscale (* set size for Sum). Grouped ops
reduce (grouped_reducescatter: gather) their gradients as a group.

``device_dense`` and ``device_sparse`` are accepted for compatibility and have no effect:
tensors reach the core through host memory. ``ignore_name_scope`` matters in a TF1 graph only,
where names come from the graph (graph.default_name).
"""
from __future__ import annotations

import numpy as np
import tensorflow as tf

from engine_native import numpy_ops
from engine_native._dtypes import Adasum, Average, Max, Min, Product, Sum, check_adasum
from engine_native.basics import global_process_set
from engine_native.basics import rank as _global_rank
from engine_native.horovod_args import resolve_op
from engine_native.tensorflow import graph, sparse
from engine_native.tensorflow import tensors as tensor_io
from engine_native.tensorflow.autodiff import differentiable
from engine_native.tensorflow.compression import Compression

_REDUCE_OPS = (Average, Sum, Adasum, Min, Max, Product)


def check_call(op_name: str, process_set, reduce_op=None, name=None, ignore_name_scope=False):
    """Argument errors at call (or trace) time, before any rank enqueues anything; returns the
    op's name (``name``; in a TF1 graph one unique in the graph: graph.default_name)."""
    numpy_ops._set_id(process_set, op_name)  # registered (the numpy API's own check)
    if reduce_op is not None and reduce_op not in _REDUCE_OPS:
        raise ValueError(f"{op_name}(): unknown op {reduce_op!r}; use hvd.Average, hvd.Sum, "
                         "hvd.Adasum, hvd.Min, hvd.Max or hvd.Product")
    return graph.default_name(name, op_name, ignore_name_scope)


def _reduce_dense(values, reduce_op, name, prescale_factor, postscale_factor, process_set,
                  op_name):
    """Allreduce dense tensors as one core group (one negotiation, fused in the core; a lone
    allreduce is a group of one), into aligned buffers that TF wraps without a copy."""
    def reduce_arrays(*arrays):
        return numpy_ops.grouped_allreduce(
            arrays, reduce_op, name, prescale_factor, postscale_factor, process_set,
            aligned=True)

    def forward(*tensors):
        return graph.run(reduce_arrays, tensors, [v.dtype for v in tensors],
                         [v.shape for v in tensors], op_name, aligned=True)

    def backward(_, grads):  # Horovod: the same reduction of the gradients (its own name)
        return _reduce_dense(grads, reduce_op, graph.default_name(None, op_name),
                             prescale_factor, postscale_factor, process_set, op_name)
    return differentiable(forward, values, backward)


def allreduce(tensor, average=None, device_dense='', device_sparse='',
              compression=Compression.none, op=None, prescale_factor=1.0,
              postscale_factor=1.0, name=None, process_set=global_process_set,
              ignore_name_scope=False):
    """Reduce ``tensor`` over the ranks of ``process_set`` (Average by default).

    Parameters
    ----------
    tensor : tf.Tensor, tf.Variable, tf.IndexedSlices, NumPy array or Python number
        Same shape and dtype on every rank. IndexedSlices are allgathered (values and
        indices) instead, as in Horovod: only Sum and Average, no scale factors.
    op : hvd.Average (default), Sum, Adasum, Min, Max or Product.
    compression : hvd.Compression.none or .fp16
    prescale_factor, postscale_factor : float
        Multiply the input before / the result after the reduction.
    name : str, optional
        Key of the op (``allreduce.<name>``); unnamed ops are counted in program order (in a
        TF1 graph, named from the graph; explicit names made unique there).
    process_set : hvd.ProcessSet

    Returns
    -------
    tf.Tensor (tf.IndexedSlices for IndexedSlices) of the input's shape and dtype.
    """
    op = resolve_op(op, average)
    name = check_call("allreduce", process_set, op, name, ignore_name_scope)
    check_adasum(op, "allreduce", process_set.size())  # Horovod's NotImplementedError
    if isinstance(tensor, tf.IndexedSlices):
        return sparse.allreduce_slices([tensor], op, prescale_factor, postscale_factor, name,
                                       process_set, grouped_allgather)[0]
    tensor = tensor_io.as_tensor(tensor, "allreduce", name or "noname")
    compressed, ctx = compression.compress(tensor)
    reduced, = _reduce_dense([compressed], op, name, prescale_factor, postscale_factor,
                             process_set, "allreduce")
    return compression.decompress(reduced, ctx)


def grouped_allreduce(tensors, average=None, device_dense='', device_sparse='',
                      compression=Compression.none, op=None, prescale_factor=1.0,
                      postscale_factor=1.0, process_set=global_process_set,
                      ignore_name_scope=False, name=None):
    """Allreduce a list of tensors as one group: they negotiate together and the core fuses
    them (one ``tf.numpy_function`` in graph mode). IndexedSlices in the list are allgathered
    as one group of their own. Returns a list in the input's order (None stays None)."""
    op = resolve_op(op, average)
    name = check_call("grouped_allreduce", process_set, op, name, ignore_name_scope)
    check_adasum(op, "grouped_allreduce", process_set.size())
    results = list(tensors)
    dense = [i for i, t in enumerate(results) if t is not None
             and not isinstance(t, tf.IndexedSlices)]
    slices = [i for i, t in enumerate(results) if isinstance(t, tf.IndexedSlices)]
    with graph.in_order():  # TF1: the allgather, then the allreduce (Note [TF1 graphs])
        _grouped_allreduce_parts(results, dense, slices, compression, op, prescale_factor,
                                 postscale_factor, process_set, name)
    return results


def _grouped_allreduce_parts(results, dense, slices, compression, op, prescale_factor,
                             postscale_factor, process_set, name):
    """grouped_allreduce's two collectives, written into ``results``: one allgather of the
    IndexedSlices at ``slices``, one grouped allreduce of the dense tensors at ``dense``."""
    if slices:
        reduced = sparse.allreduce_slices([results[i] for i in slices], op, prescale_factor,
                                          postscale_factor, name, process_set, grouped_allgather)
        for i, value in zip(slices, reduced):
            results[i] = value
    if dense:
        values, contexts = [], []
        for i in dense:
            value, ctx = compression.compress(
                tensor_io.as_tensor(results[i], "grouped_allreduce", name or "noname"))
            values.append(value)
            contexts.append(ctx)
        reduced = _reduce_dense(values, op, name, prescale_factor, postscale_factor,
                                process_set, "grouped_allreduce")
        for i, value, ctx in zip(dense, reduced, contexts):
            results[i] = compression.decompress(value, ctx)


def allgather(tensor, name=None, ignore_name_scope=False, process_set=global_process_set):
    """Concatenate every rank's ``tensor`` along dimension 0 (its size may differ per rank;
    the other dimensions may not)."""
    return grouped_allgather([tensor], name, ignore_name_scope, process_set, _op="allgather")[0]


def grouped_allgather(tensors, name=None, ignore_name_scope=False,
                      process_set=global_process_set, *, _op="grouped_allgather"):
    """Allgather each tensor of a list, as one group (fused in the core); a list back."""
    if _op != "allreduce":  # allreduce of IndexedSlices: checked and named by allreduce
        name = check_call(_op, process_set, name=name, ignore_name_scope=ignore_name_scope)
    values = [tensor_io.as_tensor(t, _op, name or "noname") for t in tensors]
    for value in values:
        if value.shape.rank == 0:
            raise ValueError(f"{_op}(): expected a tensor of rank >= 1 (gathered along "
                             "dimension 0), got a scalar; reshape it to [1]")

    def gather_arrays(*arrays):
        if _op == "allgather":
            return [numpy_ops.allgather(arrays[0], name, process_set)]
        return numpy_ops.grouped_allgather(arrays, name, process_set)

    def forward(*tensors):
        return graph.run(gather_arrays, tensors, [v.dtype for v in tensors],
                         [tf.TensorShape([None]).concatenate(v.shape[1:]) for v in tensors],
                         _op)

    def backward(_, grads):
        return _allgather_grads(values, grads, process_set)
    return differentiable(forward, values, backward)


def _allgather_grads(inputs, grads, process_set):
    """Horovod's allgather gradient: each gradient averaged over the set, then this rank's
    rows (its offset from every rank's first dimension, allgathered). None stays None (an
    integer tensor's)."""
    with graph.in_order():  # TF1: the allreduce, then the allgather (Note [TF1 graphs])
        grads = grouped_allreduce(grads, op=Average, process_set=process_set)
        rows = tf.stack([tf.shape(x, out_type=tf.int64)[0] for x in inputs])
        every = tf.reshape(allgather(rows[None], process_set=process_set),
                           [process_set.size(), len(inputs)])
    offsets = tf.reduce_sum(every[:process_set.rank()], axis=0)
    results = []
    for k, g in enumerate(grads):
        if g is not None:
            tail = [[0, g.shape.rank - 1]]
            g = tf.slice(g, tf.pad(offsets[k:k + 1], tail),
                         tf.pad(rows[k:k + 1], tail, constant_values=-1))
        results.append(g)
    return results


def broadcast(tensor, root_rank, name=None, ignore_name_scope=False,
              process_set=global_process_set):
    """``root_rank``'s ``tensor`` on every rank of ``process_set`` (a new tensor)."""
    name = check_call("broadcast", process_set, name=name,
                      ignore_name_scope=ignore_name_scope)
    value = tensor_io.as_tensor(tensor, "broadcast", name or "noname")
    root_rank = int(root_rank)

    def broadcast_array(array):
        return [numpy_ops.broadcast(array, root_rank, name, process_set)]

    def forward(tensor):
        return graph.run(broadcast_array, [tensor], [tensor.dtype], [tensor.shape],
                         "broadcast")

    def backward(_, grads):  # Horovod: averaged on the root, zeros elsewhere
        grad = allreduce(grads[0], op=Average, process_set=process_set)
        return [grad if _global_rank() == root_rank else grad * 0]
    return differentiable(forward, [value], backward)[0]


def alltoall(tensor, splits=None, name=None, ignore_name_scope=False,
             process_set=global_process_set):
    """Send ``splits[r]`` rows of ``tensor`` to rank r (equal parts when ``splits`` is None).

    Returns the received rows, and with ``splits`` given also the received splits (int32), as
    Horovod's does."""
    name = check_call("alltoall", process_set, name=name,
                      ignore_name_scope=ignore_name_scope)
    value = tensor_io.as_tensor(tensor, "alltoall", name or "noname")
    inputs = [value]
    if splits is not None:
        inputs.append(tf.cast(tensor_io.as_tensor(splits, "alltoall", "splits"), tf.int32))

    def exchange(array, split_array=None):
        received, received_splits = numpy_ops.alltoall(array, split_array, name, process_set)
        return [received, received_splits.astype(np.int32)]

    def forward(*tensors):
        return graph.run(
            exchange, tensors, [value.dtype, tf.int32],
            [tf.TensorShape([None]).concatenate(value.shape[1:]), [process_set.size()]],
            "alltoall")

    def backward(outputs, grads):  # Horovod: the gradient's rows go back where they came from
        grad, _ = alltoall(grads[0], splits=outputs[1], process_set=process_set)
        return [grad, None]
    rows, received_splits = differentiable(forward, inputs, backward)
    return (rows, received_splits) if splits is not None else rows


def reducescatter(tensor, device_dense='', compression=Compression.none, op=Average,
                  name=None, process_set=global_process_set, ignore_name_scope=False,
                  prescale_factor=1.0, postscale_factor=1.0):
    """Reduce ``tensor`` over the ranks and give each its slice of dimension 0 (the first
    ``dim0 % size`` ranks get one more row, as in Horovod)."""
    return _reducescatter_list([tensor], compression, op, name, process_set, prescale_factor,
                               postscale_factor, "reducescatter", ignore_name_scope)[0]


def grouped_reducescatter(tensors, device_dense='', compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0, name=None):
    """Reducescatter each tensor of a list, as one group (negotiated together in the core; one
    ``tf.numpy_function`` in graph mode); a list back, in order. Horovod's signature, plus
    ``name``; an empty list comes back as it is (Horovod's). Dtypes may differ within the
    list (Horovod's compiled op wants one)."""
    if not tensors:
        return tensors
    return _reducescatter_list(list(tensors), compression, op, name, process_set,
                               prescale_factor, postscale_factor, "grouped_reducescatter")


def _scattered_shape(shape: tf.TensorShape, process_set) -> tf.TensorShape:
    """This rank's static output shape: its row count when dimension 0 is known."""
    if not shape.rank:
        return tf.TensorShape(None)
    rows = None
    if shape[0] is not None and process_set.rank() not in (None, -1):
        count, n = shape[0], process_set.size()
        rows = count // n + (1 if process_set.rank() < count % n else 0)
    return tf.TensorShape([rows]).concatenate(shape[1:])


def _reducescatter_list(tensors, compression, op, name, process_set, prescale_factor,
                        postscale_factor, op_name, ignore_name_scope=False):
    """``reducescatter`` (one tensor) or ``grouped_reducescatter`` (a core group of them)."""
    name = check_call(op_name, process_set, op, name, ignore_name_scope)
    if op not in (Sum, Average):  # the core's rule too; refused here before any rank submits
        raise ValueError(f"{op_name}(): op {op!r} is not supported; use hvd.Sum or "
                         "hvd.Average")
    compressed, contexts = zip(*[compression.compress(tensor_io.as_tensor(
        t, op_name, name or "noname")) for t in tensors])

    def reduce_scatter(*arrays):
        if op_name == "reducescatter":
            return [numpy_ops.reducescatter(arrays[0], op, name, process_set, prescale_factor,
                                            postscale_factor)]
        return numpy_ops.grouped_reducescatter(arrays, op, name, process_set, prescale_factor,
                                               postscale_factor)

    def forward(*tensors):
        return graph.run(reduce_scatter, tensors, [t.dtype for t in tensors],
                         [_scattered_shape(t.shape, process_set) for t in tensors], op_name)

    def backward(_, grads):  # Horovod's scale: Sum's gradient is `size` times Average's
        scale = prescale_factor * postscale_factor * (process_set.size() if op == Sum else 1)
        present = [i for i, g in enumerate(grads) if g is not None]  # None: an integer's
        scaled = [grads[i] * tf.cast(scale, grads[i].dtype) if scale != 1 else grads[i]
                  for i in present]
        gathered = grouped_allgather(scaled, process_set=process_set) if present else []
        results = [None] * len(grads)
        for i, grad in zip(present, gathered):
            results[i] = grad
        return results
    scattered = differentiable(forward, compressed, backward)
    return [compression.decompress(s, ctx) for s, ctx in zip(scattered, contexts)]


def _refuse_graph(op: str, instead: str) -> None:
    """barrier() and join() act when called: in a graph, once while it is built."""
    if not tf.executing_eagerly():
        raise RuntimeError(
            f"{op}() runs eagerly only: in a tf.compat.v1 graph or inside tf.function it would "
            f"run once, while the graph is built, not when the graph runs. {instead}")


def barrier(process_set=global_process_set):
    """Return when every rank of ``process_set`` has reached the barrier (eager only)."""
    _refuse_graph("barrier", "Call hvd.barrier() outside the graph (between session.run "
                  "calls, or outside the tf.function).")
    numpy_ops.barrier(process_set)


def join():
    """This rank is done (it contributes zeros to others' allreduces until all have joined);
    returns the last rank to join (eager only: Horovod's returns an op, which a graph would
    run; here a graph refuses it)."""
    _refuse_graph("join", "Call hvd.join() eagerly, after the last session.run or outside "
                  "the tf.function; it returns the last rank to join.")
    return numpy_ops.join()
