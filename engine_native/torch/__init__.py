"""Horovod-compatible PyTorch API on the engine_native core.

``import engine_native.torch as hvd`` is a drop-in for ``import horovod.torch as hvd``
(Horovod 0.28): same names, signatures, defaults, return types and exceptions. Tensors cross
into the native core as raw pointers (no copy); the core negotiates, fuses and executes
collectives on its background thread.

CPU and CUDA tensors: CUDA collectives run over NCCL when every rank of a process set has a
GPU of its own, over CUDA IPC with reductions on the device when all its ranks share one GPU,
otherwise over the staged path through host memory; ``HVD_GPU_PATH`` overrides it and ``engine_native.metrics()['gpu_paths']`` tells
which path each process set took.

Differences from Horovod, by design of this build:
  * Adasum also runs on process sets and on bfloat16 tensors (Horovod: NotImplementedError,
    and "Unsupported data type").
  * ``mpi_enabled()`` is True when the ranks were started by mpiexec (they bootstrap through
    MPI), ``gloo_enabled()`` is always False; the tensors travel over the core's own
    shared-memory, TCP and NCCL transports either way.
  * SyncBatchNorm accepts CPU input (Horovod's is GPU-only).
  * ``report(samples=n, **scalars)`` (an addition) feeds the notebook dashboard's samples/s.

Example
-------
>>> import engine_native.torch as hvd
>>> hvd.init()
>>> opt = hvd.DistributedOptimizer(opt, named_parameters=model.named_parameters())
>>> hvd.broadcast_parameters(model.state_dict(), root_rank=0)
"""
from engine_native.torch.mpi_ops import (  # noqa: F401
    Adasum, AdasumSizeError, Average, Compression, HorovodInternalError, Max, Min, Product,
    ProcessSet, Sum,
    add_process_set, allgather, allgather_async, allreduce, allreduce_, allreduce_async,
    allreduce_async_, alltoall, alltoall_async, barrier, broadcast, broadcast_,
    broadcast_async, broadcast_async_, ccl_built, cross_rank, cross_size, cuda_built,
    ddl_built, gloo_built, gloo_enabled, global_process_set, grouped_allgather,
    grouped_allgather_async, grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
    grouped_allreduce_async_, grouped_reducescatter, grouped_reducescatter_async, init,
    is_initialized, join, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, poll, rank, reducescatter, reducescatter_async,
    remove_process_set, rocm_built, shutdown, size, sparse_allreduce_async, start_timeline,
    stop_timeline, synchronize)
from engine_native.torch.functions import (  # noqa: F401
    allgather_object, broadcast_object, broadcast_optimizer_state, broadcast_parameters)
from engine_native.torch.optimizer import DistributedOptimizer  # noqa: F401
# Not in Horovod: progress for the hvd-magic dashboard (a counter; harmless without one).
from engine_native.progress import report  # noqa: F401
from engine_native.torch.sync_batch_norm import SyncBatchNorm  # noqa: F401
from engine_native.torch import elastic  # noqa: F401,E402
# Not in Horovod: point-to-point between two ranks and pipeline parallelism's short form,
# hvd.pipeline.Pipeline (issue #36).
from engine_native.torch.p2p_ops import (  # noqa: F401,E402
    P2POp, batch_isend_irecv, irecv, isend, recv, send)
from engine_native.torch import pipeline  # noqa: F401,E402
