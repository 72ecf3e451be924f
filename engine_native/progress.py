"""Training progress a rank reports to whoever watches it: ``hvd.report(samples=...)``.

One call in any training loop, notebook or script::

    for batch in loader:
        loss = train_step(batch)
        hvd.report(samples=len(batch), loss=float(loss))

:func:`report` only adds to counters under a lock (about a microsecond), with or without a
watcher, so scripts started by ``hvdrun`` keep the call unchanged. The hvd-magic dashboard's
publisher thread reads :func:`totals` a few times a second and shows samples/s per rank
instead of allreduce bytes/s. Standard library only: the core is not needed to report.
"""

import operator
import threading

MAX_EXTRA = 16  # latest scalar values kept (the dashboard shows a few next to the rank)

_lock = threading.Lock()
_samples = 0
_extra: dict = {}


def report(samples=None, **extra) -> None:
    """Report training progress from this rank.

    Parameters
    ----------
    samples : int, optional
        Samples processed since the previous call (typically the local batch size); the
        dashboard turns the running total into samples/s.
    **extra : float, int, str or bool
        Latest values to show next to the rank, e.g. ``loss=0.31, epoch=2`` (the newest 16
        keys are kept).

    Raises
    ------
    TypeError, ValueError
        ``samples`` not a count >= 0, or an extra value that is not a scalar (convert a
        tensor with ``float(loss)`` or ``loss.item()``).

    Examples
    --------
    >>> import engine_native.torch as hvd
    >>> hvd.report(samples=32, loss=0.25)
    """
    global _samples
    if samples is not None:
        if isinstance(samples, bool) or not hasattr(samples, "__index__"):
            raise TypeError(f"report(samples=...): expected an int, got {type(samples).__name__}")
        samples = operator.index(samples)
        if samples < 0:
            raise ValueError(f"report(samples=...): expected a count >= 0, got {samples}")
    for k, v in extra.items():
        if not isinstance(v, (int, float, str, bool)):
            raise TypeError(f"report({k}=...): expected a number, str or bool, got "
                            f"{type(v).__name__}; pass float(value) or value.item()")
    with _lock:
        if samples is not None:
            _samples += samples
        for k, v in extra.items():
            _extra.pop(k, None)  # re-inserted last: the newest keys survive the cap
            _extra[k] = v
        while len(_extra) > MAX_EXTRA:
            del _extra[next(iter(_extra))]


def totals() -> tuple:
    """``(samples reported so far, {latest extra values})``, read atomically."""
    with _lock:
        return _samples, dict(_extra)


def reset() -> None:
    """Forget everything reported (tests; a new training run that wants fresh counters)."""
    global _samples
    with _lock:
        _samples = 0
        _extra.clear()
