"""engine_native: the native allreduce core every rank loads, with a numpy API.

>>> import engine_native as hvd
>>> hvd.init()
>>> hvd.allreduce(np.ones(3) * hvd.rank(), op=hvd.Sum)

``import engine_native.torch as hvd`` is the Horovod-compatible PyTorch API on the same core.
"""

from ._version import __version__  # noqa: F401 (one place: _version.py)
from ._core import HorovodInternalError
from ._dtypes import Adasum, AdasumSizeError, Average, Max, Min, Product, Sum
from .basics import (ProcessSet, abort, add_process_set, autotune_state, config_table,
                     cross_rank, cross_size, global_process_set, init, is_homogeneous,
                     is_initialized, listen_address, local_rank, local_size, metrics,
                     mpi_built, mpi_enabled, mpi_threads_supported, rank,
                     remove_process_set, set_autotune, shutdown, size, start_timeline,
                     stop_timeline, timeline_events)
from .numpy_ops import (allgather, allgather_async, allreduce, allreduce_async, alltoall,
                        alltoall_async, barrier, broadcast, broadcast_, broadcast_async,
                        broadcast_async_, grouped_allgather, grouped_allgather_async,
                        grouped_allreduce, grouped_allreduce_async, grouped_reducescatter,
                        grouped_reducescatter_async, join, poll, reducescatter,
                        reducescatter_async, synchronize)
from .p2p import P2POp, P2PRequest, batch_isend_irecv, irecv, isend, recv, send
from .progress import report

__all__ = [
    "HorovodInternalError", "Average", "Sum", "Adasum", "Min", "Max", "Product", "ProcessSet",
    "AdasumSizeError",
    "global_process_set", "init", "shutdown", "abort", "is_initialized", "rank", "size",
    "local_rank", "local_size", "cross_rank", "cross_size", "is_homogeneous", "listen_address",
    "mpi_built", "mpi_enabled", "mpi_threads_supported", "add_process_set",
    "remove_process_set", "metrics", "config_table", "allreduce",
    "allreduce_async", "grouped_allreduce", "grouped_allreduce_async", "allgather",
    "allgather_async", "grouped_allgather", "grouped_allgather_async", "broadcast",
    "broadcast_async", "broadcast_", "broadcast_async_", "alltoall", "alltoall_async",
    "reducescatter", "reducescatter_async", "grouped_reducescatter",
    "grouped_reducescatter_async", "barrier", "join", "poll", "synchronize",
    "start_timeline", "stop_timeline", "timeline_events", "autotune_state", "set_autotune",
    "report", "send", "recv", "isend", "irecv", "P2PRequest", "P2POp", "batch_isend_irecv",
]
