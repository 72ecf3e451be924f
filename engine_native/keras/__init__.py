"""Horovod's Keras API (``horovod.keras`` / ``horovod.tensorflow.keras``) for Keras 3, on any
Keras backend: torch, jax or tensorflow (``KERAS_BACKEND``, set before keras is imported).

>>> import engine_native.keras as hvd
>>> hvd.init()
>>> opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size()))
>>> model.compile(optimizer=opt, loss="mse")
>>> model.fit(x, y, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])

How tensors reach the core per backend, and what runs inside compiled train steps:
``engine_native.keras.backend_glue`` and docs/pages/keras.md.
"""
from engine_native import HorovodInternalError  # noqa: F401
from engine_native._dtypes import (  # noqa: F401
    Adasum, AdasumSizeError, Average, Max, Min, Product, Sum)
from engine_native.basics import (  # noqa: F401
    ProcessSet, add_process_set, cross_rank, cross_size, global_process_set, init,
    is_homogeneous, is_initialized, local_rank, local_size, mpi_built, mpi_enabled,
    mpi_threads_supported, rank, remove_process_set, shutdown, size, start_timeline,
    stop_timeline)
from engine_native.build_info import (  # noqa: F401 (Horovod's build queries)
    ccl_built, cuda_built, ddl_built, gloo_built, gloo_enabled, nccl_built, rocm_built)
# Not in Horovod: progress for the hvd-magic dashboard (a counter; harmless without one).
from engine_native.progress import report  # noqa: F401
from engine_native.keras.compression import Compression  # noqa: F401
from engine_native.keras.collectives import (  # noqa: F401
    allgather, allreduce, broadcast, broadcast_global_variables, broadcast_model,
    broadcast_variables, reducescatter)
from engine_native.keras.optimizer import DistributedOptimizer  # noqa: F401
from engine_native.keras.saving import load_model  # noqa: F401
from engine_native.keras import callbacks  # noqa: F401,E402
from engine_native.keras import elastic  # noqa: F401,E402
