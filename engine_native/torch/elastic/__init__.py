"""Elastic training, worker side (Horovod's ``hvd.elastic``): ``run``, ``TorchState``,
``ElasticSampler``.

``@hvd.elastic.run`` retries the training function after a collective fails
(HorovodInternalError: restore the last commit) or the hosts change (HostsUpdatedInterrupt):
it shuts the core down, initializes it again, runs the reset callbacks and synchronizes the
state from rank 0. Re-initialization uses the same bootstrap as the first ``init()``; growing
or shrinking the job needs a launcher with host discovery, which engine_native does not have
yet: today this recovers from aborts and transient failures with the same set of ranks.
"""
import functools

from engine_native.torch import basics
from engine_native.torch import runtime as rt
from engine_native.torch.elastic.sampler import ElasticSampler  # noqa: F401
from engine_native.torch.elastic.state import (  # noqa: F401
    HostsUpdatedInterrupt, ObjectState, State, TorchState)


def _reset():
    basics.shutdown()
    basics.init()


def run(func):
    """Decorator for an elastic training function ``func(state, *args, **kwargs)``.

    No collective may run before the decorated function is called: the first thing it does
    is ``state.sync()`` (broadcast from rank 0).
    """
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        reset_required = False
        skip_sync = False
        while True:
            if reset_required:
                _reset()
                state.on_reset()
            try:
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except rt.HorovodInternalError:
                state.restore()
                skip_sync = False
            except HostsUpdatedInterrupt as exc:
                skip_sync = exc.skip_sync
            reset_required = True
    return wrapper
