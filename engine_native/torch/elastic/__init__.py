"""Elastic training, worker side (Horovod's ``hvd.elastic``): ``run``, ``TorchState``,
``ElasticSampler``.

``@hvd.elastic.run`` retries the training function after a collective fails
(HorovodInternalError: restore the last commit) or the hosts change (HostsUpdatedInterrupt,
raised by ``state.commit()``: keep the current values): it shuts the core down, initializes it
again, runs the reset callbacks and synchronizes the state from rank 0.

Under ``hvdrun --min-np/--max-np`` (the elastic driver) re-initialization joins the driver's
newest generation: new rank and size, survivors first in their old order, so rank 0 (whose
state everybody receives) is the lowest surviving rank (engine_native.elastic_world). Started
any other way, the world keeps its ranks: this recovers from aborts and transient failures.
Process sets are not carried over a reset: register them again (e.g. in a reset callback).
"""
from engine_native import basics as _basics
from engine_native import elastic_world
from engine_native.elastic_state import run_fn
from engine_native.torch import basics
from engine_native.torch import runtime as rt
from engine_native.torch.elastic.sampler import ElasticSampler  # noqa: F401
from engine_native.torch.elastic.state import HostsUpdatedInterrupt, ObjectState, State, TorchState  # noqa: F401


def _reset(after_failure):
    if after_failure:
        elastic_world.request_reset()  # a failure no death explains still gets a new world
    why = f'the elastic reset after generation {elastic_world.generation()}' \
        if elastic_world.managed() else 'an elastic reset'
    try:
        _basics.shutdown(why)
    finally:
        rt._reset_handles()
    basics.init()


def run(func):
    """Decorator for an elastic training function ``func(state, *args, **kwargs)``.

    No collective may run before the decorated function is called: the first thing it does
    is ``state.sync()`` (broadcast from rank 0).
    """
    return run_fn(func, _reset)
