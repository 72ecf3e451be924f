"""Horovod-compatible TensorFlow API on the engine_native core.

``import engine_native.tensorflow as hvd`` is a drop-in for ``import horovod.tensorflow as hvd``
(Horovod 0.28): init and topology, process sets,
allreduce (also of tf.IndexedSlices), grouped_allreduce, allgather, grouped_allgather,
broadcast, alltoall, reducescatter, grouped_reducescatter, broadcast_variables,
broadcast_object, allgather_object, DistributedGradientTape, Compression, and ``hvd.elastic``
(run, TensorFlowState, TensorFlowKerasState). Eager and inside ``tf.function``; in
``tf.compat.v1`` graphs and sessions too, with DistributedOptimizer (of a tf.compat.v1
optimizer; a Keras one goes to engine_native.keras), broadcast_global_variables and
BroadcastGlobalVariablesHook (legacy.py).
``tf.GradientTape`` differentiates through the collectives with Horovod's registered gradients
(autodiff.py, mpi_ops.py).

Differences from Horovod, by design of this binding:
  * No compiled TF ops: inside ``tf.function`` a collective is a stateful
    ``tf.numpy_function`` (graph.py), so ``tf.function(jit_compile=True)`` refuses it with an
    error, a SavedModel that contains one cannot run in another process, and errors inside a
    graph arrive as ``tf.errors`` (InvalidArgumentError for a ValueError/TypeError, Unknown
    otherwise) with the core's message.
  * Tensors reach the core through host memory (``device_dense``/``device_sparse`` are
    ignored); a GPU tensor is copied to host and back.
  * Elastic states are TF2 only (a TF1 session is refused).
  * In a TF1 graph an unnamed collective is named from the graph (graph.py, Note [TF1
    graphs]); no ``*_op`` tensors; for a tf.compat.v1 optimizer no
    ``backward_passes_per_step > 1`` or Adasum delta optimizer.
  * ``report(samples=n, **scalars)`` (an addition) feeds the notebook dashboard's samples/s.

Example
-------
>>> import engine_native.tensorflow as hvd
>>> hvd.init()
>>> hvd.broadcast_variables(model.variables, root_rank=0)
>>> with tf.GradientTape() as tape:
...     loss = loss_fn(model(x), y)
>>> grads = hvd.DistributedGradientTape(tape).gradient(loss, model.trainable_variables)
"""
from engine_native._core import HorovodInternalError  # noqa: F401
from engine_native._dtypes import (  # noqa: F401
    Adasum, AdasumSizeError, Average, Max, Min, Product, Sum)
from engine_native.basics import (  # noqa: F401
    ProcessSet, add_process_set, cross_rank, cross_size, global_process_set, is_homogeneous,
    is_initialized, local_rank, local_size, mpi_built, mpi_enabled, mpi_threads_supported,
    rank, remove_process_set, shutdown, size, start_timeline, stop_timeline)
from engine_native.build_info import (  # noqa: F401 (Horovod's build queries)
    ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, nccl_built, rocm_built)
from engine_native.tensorflow.basics import init  # noqa: F401
from engine_native.tensorflow.compression import Compression  # noqa: F401
from engine_native.tensorflow.mpi_ops import (  # noqa: F401
    allgather, allreduce, alltoall, barrier, broadcast, grouped_allgather, grouped_allreduce,
    grouped_reducescatter, join, reducescatter)
from engine_native.tensorflow.functions import (  # noqa: F401
    allgather_object, broadcast_object, broadcast_variables)
from engine_native.tensorflow.gradient_tape import DistributedGradientTape  # noqa: F401
from engine_native.tensorflow.legacy import (  # noqa: F401
    BroadcastGlobalVariablesHook, DistributedOptimizer, broadcast_global_variables)
from engine_native.tensorflow import elastic  # noqa: F401
# Not in Horovod: progress for the hvd-magic dashboard (a counter; harmless without one).
from engine_native.progress import report  # noqa: F401
