"""Horovod-style JAX API on the engine_native core (Horovod itself has no JAX binding).

``import engine_native.jax as hvd``: the basics of ``horovod.torch`` (init, rank, size,
process sets, reduce ops), the collectives on ``jax.Array`` (allreduce, grouped_allreduce,
allgather, grouped_allgather, broadcast, reducescatter, alltoall: eagerly, with ``_async``
handles, and inside ``jax.jit`` as XLA FFI custom calls or ordered host callbacks:
``jit_path()``), pytree helpers, and an optax
transformation that averages gradients across ranks, with ``Compression.fp16`` and
``backward_passes_per_step`` (local accumulation, one allreduce every k steps, also inside
jit). Docs: docs/pages/jax.md.

Example
-------
>>> import engine_native.jax as hvd
>>> hvd.init()
>>> params = hvd.broadcast_parameters(params, root_rank=0)
>>> tx = hvd.DistributedGradientTransformation(optax.adam(1e-3))
>>> @jax.jit
... def step(params, opt_state, batch):
...     grads = jax.grad(loss)(params, batch)
...     updates, opt_state = tx.update(grads, opt_state, params)  # one fused allreduce
...     return optax.apply_updates(params, updates), opt_state
"""
from engine_native._core import HorovodInternalError  # noqa: F401
from engine_native._dtypes import (  # noqa: F401
    Adasum, AdasumSizeError, Average, Max, Min, Product, Sum)
from engine_native.basics import (  # noqa: F401
    ProcessSet, add_process_set, cross_rank, cross_size, global_process_set, init,
    is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, rank, remove_process_set, shutdown, size, start_timeline,
    stop_timeline)
from engine_native.build_info import (  # noqa: F401 (Horovod's build queries)
    ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, nccl_built, rocm_built)
from engine_native.numpy_ops import barrier, join  # noqa: F401 (no array crosses)
from engine_native.jax.collectives import (  # noqa: F401
    allgather, allgather_async, allreduce, allreduce_async, alltoall, alltoall_async,
    broadcast, broadcast_async, grouped_allgather, grouped_allgather_async, grouped_allreduce,
    grouped_allreduce_async, poll,
    reducescatter, reducescatter_async, synchronize)
from engine_native.jax.xla_ffi import jit_path, jit_path_reason  # noqa: F401 (jit's path)
from engine_native.jax.pytrees import allreduce_pytree, broadcast_parameters  # noqa: F401
from engine_native.objects import allgather_object, broadcast_object  # noqa: F401
from engine_native.jax.compression import Compression  # noqa: F401
from engine_native.jax.optax_ops import (  # noqa: F401
    DistributedGradientTransformation, DistributedState, average_gradients)
# Not in Horovod: progress for the hvd-magic dashboard (a counter; harmless without one).
from engine_native.progress import report  # noqa: F401
