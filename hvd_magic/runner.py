"""``HorovodRunner``: Databricks' launcher contract, on this project's core.

>>> from hvd_magic import HorovodRunner
>>> def main(lr=0.1):
...     import engine_native.torch as hvd
...     hvd.init()
...     return train(lr)                  # rank 0's return value comes back
>>> HorovodRunner(np=-2).run(main, lr=0.05)     # 2 processes on this machine (the driver)
>>> HorovodRunner(np=4).run(main, lr=0.05)      # 4 barrier tasks on the active Spark cluster

``np < 0``: ``-np`` local processes (hvd_magic.run); ``np > 0``: ``np`` Spark tasks in
barrier mode (hvd_magic.spark); ``np == 0``: every task slot of the cluster. ``main`` and the
keyword arguments travel by cloudpickle: an unpicklable capture is named with the fix.
"""

from __future__ import annotations

from .gpu_pinning import check_choice

__all__ = ["HorovodRunner"]

_VERBOSITY = ("all", "log_callback_only")


class HorovodRunner:
    """Run a training function on ``np`` ranks and return rank 0's result.

    Parameters
    ----------
    np : int
        ``< 0``: run ``-np`` processes locally, on the driver (for development);
        ``> 0``: run ``np`` tasks on the active Spark cluster in barrier mode;
        ``0``: use every task slot of the cluster.
    driver_log_verbosity : "all" or "log_callback_only"
        "all" streams every rank's output to the caller; "log_callback_only" only rank 0's.
    gpus : "auto" or "none"
        (Not in Databricks' API.) "auto": every rank gets one GPU of its host before ``main``
        runs (hvd_magic.gpu_pinning; ``torch.cuda.set_device(hvd.local_rank())`` still
        works); "none": the GPUs are hidden from the ranks.
    """

    def __init__(self, np: int, driver_log_verbosity: str = "all", *, gpus: str = "auto"):
        if isinstance(np, bool) or not isinstance(np, int):
            raise TypeError(f"HorovodRunner(np=...): np must be an int, got {np!r}")
        if driver_log_verbosity not in _VERBOSITY:
            raise ValueError(f"HorovodRunner: driver_log_verbosity must be one of {_VERBOSITY}, "
                             f"got {driver_log_verbosity!r}")
        self.num_processor = np
        self.driver_log_verbosity = driver_log_verbosity
        self.gpus = check_choice(gpus, "HorovodRunner")

    @property
    def np(self) -> int:
        return self.num_processor

    def run(self, main, **kwargs):
        """Run ``main(**kwargs)`` on every rank and return rank 0's return value.

        Raises
        ------
        hvd_magic.launch.RankFailedError
            A rank raised or died (names it, with its remote traceback).
        hvd_magic.launch.pickling.UnpicklableError
            ``main`` or a keyword argument cannot be pickled (names the object and the fix).
        """
        name = getattr(main, "__name__", "main")
        what = f"HorovodRunner.run({name})"
        only = [0] if self.driver_log_verbosity == "log_callback_only" else None
        if self.num_processor < 0:
            from .launch.runfn import run
            return run(main, kwargs=kwargs, np=-self.num_processor, what=what,
                       only_ranks=only, gpus=self.gpus)[0]
        from .spark.driver import run_on_spark
        hide = {"CUDA_VISIBLE_DEVICES": ""} if self.gpus == "none" else None
        return run_on_spark(main, kwargs=kwargs, num_proc=self.num_processor or None,
                            what=what, only_ranks=only, env=hide)[0]

    def __repr__(self) -> str:
        return f"HorovodRunner(np={self.num_processor})"
