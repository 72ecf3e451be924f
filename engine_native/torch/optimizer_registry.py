"""The live DistributedOptimizers of this process (plain and Adasum), so that a notebook's
recovery can ``reset()`` them without walking the whole heap."""
import weakref

_live = weakref.WeakValueDictionary()  # by id: a user's optimizer class need not be hashable


def track(optimizer) -> None:
    """Called by each DistributedOptimizer's ``__init__``."""
    _live[id(optimizer)] = optimizer


def reset_all() -> int:
    """``reset()`` every live DistributedOptimizer (after an abort their in-flight gradient
    handles belong to the aborted core); returns how many."""
    live = list(_live.values())
    for optimizer in live:
        optimizer.reset()
    return len(live)
