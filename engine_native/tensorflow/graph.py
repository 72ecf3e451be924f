"""One way to run a core collective from TensorFlow, eager or inside ``tf.function``.

Eager: the NumPy function runs at once on views of the input tensors (tensors.py) and its
results become tensors without a copy.

Graph (``tf.function``): there are no compiled Horovod ops here, so the NumPy function runs in
a ``tf.numpy_function`` marked ``stateful=True``. Stateful ops are never pruned, constant-folded
or merged, and ``tf.function``'s automatic control dependencies chain them in program order, so
every rank runs its collectives in the order the Python code wrote them (the core matches ops
by name, and unnamed ops take their name from a counter when they run). A function graph that
TF builds itself has no automatic control dependencies -- the backward function of a
``tf.function`` differentiated by a tape outside it, where the gradients' collectives
(autodiff.py) would otherwise run in any order -- so each collective created in a function
graph also waits for the one created before it there (redundant under tf.function, which
chains them already). The static shapes the caller knows are set on the outputs, since
``numpy_function`` returns unknown shapes.

XLA cannot compile a Python callback: inside ``tf.function(jit_compile=True)`` a collective is
refused while tracing with an error that says what to do instead.

Note [TF1 graphs]. In a ``tf.compat.v1`` graph run by a Session there are no automatic control
dependencies, and chaining the collectives here would make every ``session.run`` run all
earlier ones (a training step would repeat the broadcast of the initial variables). The
executor may run the independent collectives of one ``session.run`` in any order, at the same
time, so a counter could give the same name to different tensors on different ranks. Instead
an op takes a name from the graph when it is built (``default_name``: unique in the graph,
the same on every rank that builds the same graph, as Horovod names its ops after their graph
nodes; an explicit name too, made unique as a node's); the core matches the names, whatever
order they run in. Each waits on its own
executor thread: more independent collectives in one ``session.run`` than the session's
``inter_op_parallelism_threads`` could leave ranks waiting on different ones, every thread
taken, none matched. Where one call builds several collectives that always run together (the
groups of a DistributedOptimizer, the sparse and dense parts of a grouped allreduce), it builds
them under ``in_order()``: each waits for the one built before it there, so they run one at a
time in the same order on every rank. A user's own independent collectives are the user's to
chain (``tf.control_dependencies``).
"""
from __future__ import annotations

import contextlib
import weakref
from typing import Callable, Sequence

import tensorflow as tf

from engine_native.tensorflow import tensors

try:  # private TF module; without it, XLA refuses the callback itself when compiling
    from tensorflow.python.ops.control_flow_util import GraphOrParentsInXlaContext as _in_xla
except ImportError:  # pragma: no cover - other TF versions
    _in_xla = None


# The last collective created in each function graph, and in each TF1 graph inside in_order()
# (the module docstring and Note [TF1 graphs]).
_last_collective: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
# TF1 graphs being built inside in_order(): how deep.
_ordered_depth: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def in_xla() -> bool:
    """True while tracing a function that XLA compiles (``jit_compile=True``)."""
    return _in_xla is not None and _in_xla(tf.compat.v1.get_default_graph())


def _refuse_xla(op: str) -> None:
    if in_xla():
        raise RuntimeError(
            f"{op}(): collectives cannot run inside tf.function(jit_compile=True): XLA cannot "
            "compile the Python callback (tf.numpy_function) that reaches the engine_native "
            "core. Keep the collective in a tf.function without jit_compile (e.g. compute the "
            "gradients in a jit-compiled function and reduce them outside it); with Keras, "
            "compile the model with jit_compile=False.")


def default_name(name, op: str, ignore_name_scope: bool = False):
    """The op's name. In a TF1 graph (Note [TF1 graphs]) one unique in the graph, as TF makes
    node names unique (``loss``, ``loss_1``, ...): ``name``, or ``hvd_<op>`` for an unnamed op,
    under the current name scope (an explicit name outside any with ``ignore_name_scope``), so
    one call built twice (a tower) gives two ops. Elsewhere ``name`` as given (eager and
    ``tf.function``: None, the counter names it)."""
    if not _tf1_graph():
        return name
    graph = tf.compat.v1.get_default_graph()
    if not name:
        return graph.unique_name(f"hvd_{op}")
    if ignore_name_scope:
        with graph.name_scope(None):
            return graph.unique_name(name)
    return graph.unique_name(name)


def _tf1_graph() -> bool:
    return not tf.executing_eagerly() and not tf.inside_function()


@contextlib.contextmanager
def in_order():
    """In a TF1 graph, each collective built inside waits for the one built before it inside
    (Note [TF1 graphs]); the chain starts afresh at the outermost entry. Nothing elsewhere:
    eager runs in program order, and a function graph chains every collective already."""
    if not _tf1_graph():
        yield
        return
    graph = tf.compat.v1.get_default_graph()
    depth = _ordered_depth.get(graph, 0)
    if depth == 0:
        _last_collective.pop(graph, None)
    _ordered_depth[graph] = depth + 1
    try:
        yield
    finally:
        _ordered_depth[graph] = depth
        if depth == 0:
            _last_collective.pop(graph, None)


def run(numpy_fn: Callable, inputs: Sequence[tf.Tensor], out_dtypes: Sequence[tf.DType],
        out_shapes: Sequence, op: str, aligned: bool = False) -> list:
    """``numpy_fn(*arrays) -> list of arrays`` on ``inputs``; a list of tensors, one per
    ``out_dtypes`` entry, with ``out_shapes`` (``tf.TensorShape``-likes) set in graph mode.
    ``aligned``: numpy_fn returns aligned_buffers views (numpy_ops' ``aligned=True``)."""
    if tf.executing_eagerly():
        results = numpy_fn(*[tensors.to_numpy(t) for t in inputs])
        return [tensors.to_tensor(array, aligned) for array in results]
    _refuse_xla(op)
    graph = tf.compat.v1.get_default_graph()
    chained = tf.inside_function() or _ordered_depth.get(graph, 0) > 0
    previous = _last_collective.get(graph) if chained else None
    with tf.control_dependencies([previous] if previous is not None else []):
        outputs = tf.numpy_function(numpy_fn, list(inputs), list(out_dtypes), stateful=True,
                                    name=f"hvd_{op}")
    if chained:
        _last_collective[graph] = outputs[0].op
    for output, shape in zip(outputs, out_shapes):
        output.set_shape(shape)
    return list(outputs)
