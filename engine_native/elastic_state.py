"""Elastic training state, framework-neutral (Horovod's ``horovod/common/elastic.py``):
``State``, ``ObjectState``, ``HostsUpdatedInterrupt`` and the retry loop of ``run``.

A state object can ``commit()`` (save a copy in memory), ``restore()`` the last commit after a
failed collective, and ``sync()`` every rank to rank 0's values after a reset. The bindings
(engine_native.torch.elastic, engine_native.keras.elastic) add the states of their models and
optimizers and the reset of their own handles.
"""
import abc
import copy
import functools

from engine_native import basics, elastic_world
from engine_native._core import HorovodInternalError


class HostsUpdatedInterrupt(RuntimeError):
    """Hosts were added or removed: the job must re-initialize (not a failure)."""

    def __init__(self, skip_sync=False):
        super().__init__('hosts updated')
        self.skip_sync = skip_sync


class State(abc.ABC):
    """State representation used for tracking in memory state across workers.

    Parameters
    ----------
    bcast_object : callable
        ``broadcast_object``-like function used to agree on values across ranks.
    get_rank : callable
        Returns this process's rank.
    """

    def __init__(self, bcast_object, get_rank):
        self._bcast_object = bcast_object
        self._rank = get_rank
        self._reset_callbacks = []
        self._host_messages = []
        self._last_updated_timestamp = 0

    def register_reset_callbacks(self, callbacks):
        """Functions called (in order) after every reset, before ``sync()``."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self):
        self._host_messages = []
        for callback in self._reset_callbacks:
            callback()

    def on_hosts_updated(self, timestamp, update_res):
        """Record a host change pushed by an elastic driver."""
        self._host_messages.append((timestamp, update_res))

    def commit(self):
        """Save the state in memory and check for host updates (may raise
        HostsUpdatedInterrupt on every rank at once)."""
        self.save()
        self.check_host_updates()

    def check_host_updates(self):
        """Raise HostsUpdatedInterrupt on every rank when a host change was recorded."""
        last = self._last_updated_timestamp
        newest = max([ts for ts, _ in self._host_messages], default=last)
        self._host_messages = []
        # Under the elastic driver rank 0 also asks the store whether a newer generation
        # (hosts added or removed) was published; its answer is everybody's.
        published = self._rank() == 0 and elastic_world.newer_generation_published()
        newest, published = self._bcast_object((newest, published), root_rank=0,
                                               name='elastic.host_update')
        if newest > last or published:
            self._last_updated_timestamp = newest
            raise HostsUpdatedInterrupt(skip_sync=False)

    # Each concrete state defines these three (ObjectState and the bindings' states do); a
    # subclass missing one cannot be constructed, and the TypeError names it.
    @abc.abstractmethod
    def save(self):
        """Keep a copy of the state in memory (``commit()`` calls it)."""

    @abc.abstractmethod
    def restore(self):
        """Put back the last copy ``save()`` kept (after a failed collective)."""

    @abc.abstractmethod
    def sync(self):
        """Make every rank's state rank 0's (after a reset)."""

    def reset(self):
        pass


class ObjectState(State):
    """State of plain Python attributes (``state.epoch``, ``state.batch``...)."""

    def __init__(self, bcast_object, get_rank, **kwargs):
        super().__init__(bcast_object, get_rank)
        self._saved_state = kwargs
        self._set_attrs()

    def save(self):
        self._saved_state = {attr: copy.deepcopy(getattr(self, attr))
                             for attr in self._saved_state}

    def restore(self):
        self._set_attrs()

    def sync(self):
        if self._saved_state:
            self._saved_state = self._bcast_object(self._saved_state, root_rank=0,
                                                   name='elastic.object_state')
            self._set_attrs()

    def _set_attrs(self):
        for attr, value in self._saved_state.items():
            setattr(self, attr, copy.deepcopy(value))


def reset_core(after_failure):
    """The reset of ``run_fn`` for the bindings without handles of their own (Keras,
    TensorFlow): shut the core down and initialize it again, in the elastic driver's newest
    generation when there is one (a failure no death explains asks the driver for one)."""
    if after_failure:
        elastic_world.request_reset()
    why = f"the elastic reset after generation {elastic_world.generation()}" \
        if elastic_world.managed() else "an elastic reset"
    basics.shutdown(why)
    basics.init()


def run_fn(func, reset):
    """Wrap an elastic training function ``func(state, *args, **kwargs)``: after a failed
    collective (HorovodInternalError) restore the last commit, after a host change
    (HostsUpdatedInterrupt) keep the current values; then ``reset(after_failure)`` (shut the
    core down and initialize it again), ``state.on_reset()``, ``state.sync()`` and call
    ``func`` again. No collective may run before the wrapped function is called: the first
    thing it does is ``state.sync()`` (broadcast from rank 0)."""
    @functools.wraps(func)
    def wrapper(state, *args, **kwargs):
        reset_required = False
        after_failure = False
        skip_sync = False
        while True:
            try:
                if reset_required:  # inside the try: a peer lost while joining → again
                    reset(after_failure)
                    state.on_reset()
                if not skip_sync:
                    state.sync()
                return func(state, *args, **kwargs)
            except HorovodInternalError:
                state.restore()
                skip_sync, after_failure = False, True
            except HostsUpdatedInterrupt as exc:
                skip_sync, after_failure = exc.skip_sync, False
            reset_required = True
    return wrapper
