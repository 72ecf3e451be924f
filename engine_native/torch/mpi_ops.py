"""Horovod's ``horovod.torch.mpi_ops`` module path: every collective and basic in one place.

Scripts sometimes import from here directly (``from horovod.torch.mpi_ops import Sum``); the
implementations live in ``basics``, ``runtime`` (handles), ``reduce_ops``, ``gather_ops`` and
``broadcast_ops``.
"""
from engine_native.torch.compression import Compression  # noqa: F401
from engine_native.torch.basics import (  # noqa: F401
    ccl_built, cross_rank, cross_size, cuda_built, ddl_built, gloo_built, gloo_enabled, init,
    is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, nccl_built, rank, rocm_built, shutdown, size, start_timeline,
    stop_timeline)
from engine_native.torch.runtime import (  # noqa: F401
    Adasum, AdasumSizeError, Average, HorovodInternalError, Max, Min, Product, ProcessSet, Sum,
    add_process_set, barrier, global_process_set, join, poll, remove_process_set, synchronize)
from engine_native.torch.reduce_ops import (  # noqa: F401
    HorovodAllreduce, HorovodGroupedAllreduce, allreduce, allreduce_, allreduce_async,
    allreduce_async_, grouped_allreduce, grouped_allreduce_, grouped_allreduce_async,
    grouped_allreduce_async_)
from engine_native.torch.gather_ops import (  # noqa: F401
    HorovodAllgather, HorovodGroupedAllgather, HorovodGroupedReducescatter,
    HorovodReducescatter, allgather, allgather_async, grouped_allgather,
    grouped_allgather_async, grouped_reducescatter, grouped_reducescatter_async,
    reducescatter, reducescatter_async, sparse_allreduce_async)
from engine_native.torch.broadcast_ops import (  # noqa: F401
    HorovodAlltoall, HorovodBroadcast, alltoall, alltoall_async, broadcast, broadcast_,
    broadcast_async, broadcast_async_)
from engine_native.torch.runtime import _handle_map  # noqa: F401  (Horovod exposes it too)
