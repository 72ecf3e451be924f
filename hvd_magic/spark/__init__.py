"""Horovod on Spark with this project's core: ``hvd_magic.spark.run`` (horovod.spark.run's
shape) on Spark's barrier execution mode, which HorovodRunner(np > 0) also uses.

>>> from hvd_magic import spark as hvd_spark
>>> hvd_spark.run(train, args=(0.1,), num_proc=2)      # inside an active Spark session
[result_of_rank_0, result_of_rank_1]

The estimator (``TorchEstimator``, ``TorchModel``, ``Store``) trains on a DataFrame with every
rank reading its share of the data as Parquet (torch_estimator.py).

pyspark is imported only when a run starts or the estimator is used.
"""

from __future__ import annotations

__all__ = ["run", "Store", "TorchEstimator", "TorchModel"]

_LAZY = {"Store": ".store", "TorchEstimator": ".torch_estimator", "TorchModel": ".torch_model"}


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def run(fn, args=(), kwargs=None, num_proc: int | None = None,
        start_timeout: float | None = None, use_mpi=None, use_gloo=None,
        extra_mpi_args=None, env: dict | None = None, stdout=None, stderr=None,
        verbose: int = 1, nics=None, prefix_output_with_timestamp: bool = False,
        executable: str | None = None) -> list:
    """Run ``fn(*args, **kwargs)`` on ``num_proc`` Spark tasks as ranks; results in rank order.

    Parameters
    ----------
    fn, args, kwargs : the function and its arguments (cloudpickled; closures work).
    num_proc : number of ranks = barrier tasks (default: ``spark.default.parallelism``).
    start_timeout : seconds for all tasks to be scheduled and meet (default
        ``HOROVOD_SPARK_START_TIMEOUT`` or 600); then the job is cancelled with a TimeoutError.
    env : extra environment variables for the ranks.
    stdout, stderr : streams for the ranks' prefixed output (default: this process's).
    prefix_output_with_timestamp : add the time to each output line.
    executable : Python that runs the ranks on the executors (default: the task's).
    use_mpi, use_gloo, extra_mpi_args, nics : accepted for compatibility; ranks always
        bootstrap through the driver's authenticated rendezvous store.

    Raises
    ------
    RankFailedError : a rank raised or died (rank, remote traceback); the job is cancelled.
    UnpicklableError : ``fn`` or an argument cannot be pickled (names it and the fix).
    TimeoutError : the tasks did not all start (barrier mode needs num_proc free slots).
    """
    from .driver import run_on_spark

    if use_mpi:
        raise ValueError("hvd_magic.spark.run: use_mpi is not supported; ranks bootstrap "
                         "through the driver's rendezvous store (leave use_mpi unset)")
    return run_on_spark(fn, args, kwargs, num_proc=num_proc, start_timeout=start_timeout,
                        env=env, stdout=stdout, stderr=stderr,
                        prefix_output_with_timestamp=prefix_output_with_timestamp,
                        executable=executable, verbose=verbose)
