"""Plumbing between ``engine_native.torch`` and the native core.

Owns the reduce-op and dtype tables, the tensor checks, Horovod's op names and the handle
table that keeps tensors alive while the core works on their memory (lifecycle, topology and
build queries are in ``engine_native.torch.basics``). Called on the user's (framework) thread
only; the core's background thread never calls back into Python.

Note [Handle lifetime]
    ``_core.enqueue`` receives raw pointers. The tensors behind them (inputs, in-place outputs,
    splits, compressed copies) are stored in ``_handle_map`` under the handle returned to the
    user and dropped only after ``_core.wait`` returned for every core handle of the op. A
    KeyboardInterrupt inside ``wait`` leaves the record in place: the op is still pending in
    the core, so its memory must stay alive until ``abort()``/``shutdown()``. Allreduces taken
    by the C path (``_core.torch_allreduce_async``) keep their tensors in the core's table by
    the same rule (bindings/kept_table.h); ``synchronize`` and ``poll`` look there when
    ``_handle_map`` does not hold the handle.
"""
import itertools
import math

import torch

from engine_native import _core
from engine_native import basics as _basics
from engine_native._dtypes import AdasumSizeError
from engine_native.torch import devices

HorovodInternalError = _basics.HorovodInternalError
ProcessSet = _basics.ProcessSet
global_process_set = _basics.global_process_set
add_process_set = _basics.add_process_set
remove_process_set = _basics.remove_process_set

# Reduce-op codes, Horovod's numbering (csrc/common/dtype.h ReduceOp).
Average, Sum, Adasum, Min, Max, Product = 0, 1, 2, 3, 4, 5
_OP_NAMES = {Average: 'Average', Sum: 'Sum', Adasum: 'Adasum', Min: 'Min', Max: 'Max',
             Product: 'Product'}

# Op kinds (coord::OpType); the core exports the same numbers.
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER, BARRIER, JOIN = range(7)

# dtype codes (csrc/common/dtype.h DataType).
_DTYPE_CODES = {
    torch.uint8: 0, torch.int8: 1, torch.int16: 2, torch.int32: 3, torch.int64: 4,
    torch.float16: 5, torch.bfloat16: 6, torch.float32: 7, torch.float64: 8, torch.bool: 9,
}

_NOT_INITIALIZED = 'Horovod has not been initialized; use hvd.init().'


# ---------------------------------------------------------------------------------------------
# The queries the collectives need (the rest of the basics live in engine_native.torch.basics)

def is_initialized():
    """True between ``init()`` and ``shutdown()``."""
    return bool(_basics.is_initialized())


def _require_init():
    if not _basics.is_initialized():
        raise ValueError(_NOT_INITIALIZED)


def size():
    """Number of processes (ranks) in the job."""
    _require_init()
    return _basics.size()


def rank():
    """Global rank of this process."""
    _require_init()
    return _basics.rank()


# ---------------------------------------------------------------------------------------------
# Tensor checks

def dtype_code(tensor, op_name):
    """Core dtype code of ``tensor``; ValueError (Horovod's type) when unsupported."""
    code = _DTYPE_CODES.get(tensor.dtype)
    if code is None:
        raise ValueError('%s: Tensor type %s is not supported.' % (op_name, tensor.type()))
    return code


def check_tensor(tensor, op_name, name):
    """Validate a tensor handed to a collective; returns its dtype code.

    Raises
    ------
    TypeError
        ``tensor`` is not a torch.Tensor.
    ValueError
        Unsupported dtype or device (CPU and CUDA tensors are), sparse layout, or
        non-contiguous memory (Horovod's messages, prefixed with the operation and tensor
        name).
    """
    label = '%s(%r)' % (op_name, name) if name is not None else op_name
    if not isinstance(tensor, torch.Tensor):
        raise TypeError('%s: expected a torch.Tensor, got %s' % (label, type(tensor).__name__))
    if tensor.device.type not in ('cpu', 'cuda'):
        raise ValueError('%s: Tensor type %s on device %s is not supported; only CPU and CUDA '
                         'tensors are.' % (label, tensor.dtype, tensor.device))
    if tensor.layout != torch.strided:
        raise ValueError('%s: Tensor layout %s is not supported; use a dense tensor '
                         '(tensor.to_dense()).' % (label, tensor.layout))
    code = dtype_code(tensor, label)
    if not tensor.is_contiguous():
        raise ValueError('%s: Tensor is required to be contiguous; got shape %s with strides '
                         '%s. Call .contiguous() first.'
                         % (label, tuple(tensor.shape), tuple(tensor.stride())))
    return code



def check_op(op, op_name, process_set=None):
    """Validate a reduce op code; Adasum also needs a power-of-two ``process_set`` (Horovod's
    rule, checked here as Horovod does, so every rank raises before anything is enqueued)."""
    if op not in _OP_NAMES:
        raise ValueError('%s: unknown reduce op %r; use hvd.Average, hvd.Sum, hvd.Min, '
                         'hvd.Max, hvd.Product or hvd.Adasum.' % (op_name, op))
    if op == Adasum and process_set is not None:
        n = process_set.size()
        if n is not None and n & (n - 1) != 0:
            raise AdasumSizeError(
                '%s: Running Adasum with non-power of 2 ranks is not supported yet (the '
                'process set has %d ranks); use 1, 2, 4, 8, ... ranks, or op=hvd.Average.'
                % (op_name, n))


def needs_autograd(tensors):
    """True when an autograd Function must record the op: grad mode is on and some input
    requires grad. Otherwise ``Function.apply`` only adds its bookkeeping (~1 µs per tensor
    of a group) to outputs that carry no grad_fn either way."""
    return torch.is_grad_enabled() and any(getattr(t, 'requires_grad', False) for t in tensors)


def set_id(process_set):
    """Core id of a ProcessSet (Horovod's ``process_set_id``)."""
    ps_id = getattr(process_set, 'process_set_id', None)
    why = getattr(process_set, 'invalidated_by', None)
    if ps_id is None and why:
        raise ValueError('process_set: %r was registered before %s; process sets are not '
                         'carried over to the new world: register it again with '
                         'hvd.add_process_set(%r) after the reset (e.g. in a reset callback)'
                         % (process_set, why, process_set.ranks))
    if ps_id is None:
        raise ValueError('process_set: expected an hvd.ProcessSet registered with init() or '
                         'add_process_set(), got %r' % (process_set,))
    return ps_id


def tensor_op(kind, full_name, code, tensor, output_ptr, reduce_op, prescale, postscale, root,
              ps_id, splits=None):
    """The ``_core.enqueue`` argument tuple of an op on ``tensor``, with its placement
    (device and producer stream: ``devices.placement``)."""
    device, stream = devices.placement(tensor)
    return (kind, full_name, code, tuple(tensor.shape), tensor.data_ptr(), output_ptr,
            reduce_op, float(prescale), float(postscale), root, ps_id, splits, device, stream)


def tensor_from_buffer(buffer, shape, dtype):
    """Wrap a core-owned output Buffer as a tensor of ``shape`` and ``dtype`` without a copy,
    on the Buffer's device (CUDA memory when the op ran on CUDA tensors). The tensor holds a
    reference to the Buffer, so the memory lives as long as the tensor."""
    shape = tuple(map(int, shape))
    if buffer.device >= 0:
        return devices.device_tensor(buffer, shape, dtype)
    count = math.prod(shape)
    if count == 0:
        return torch.empty(shape, dtype=dtype)
    flat = torch.frombuffer(buffer, dtype=dtype, count=count)
    # view(*shape): torch parses a tuple argument ~2 µs slower (a pipeline's every hand-off)
    return flat.view(*shape) if shape else flat.view(())


# ---------------------------------------------------------------------------------------------
# Names: Horovod's "<op>.<name>" and "<op>.noname.<n>". Horovod's n is the op's handle; here it
# counts unnamed ops since init(), per process set (Note [Noname counters]).
#
# Note [Noname counters]
# Ranks match ops by name, so the n of an unnamed op must be the same on every rank of its set.
# A rank outside a process set never runs that set's ops, so one counter for all sets (or
# Horovod's handle number) drifts apart across ranks as soon as a sub-set runs unnamed ops, and
# the next unnamed global op waits forever for a name no other rank submits. A counter per set
# only advances with ops every member of the set runs, so it stays equal across its members
# (named ops, and ops of other sets, never shift it). A join is the exception: a joined rank
# runs none of the ops the others still run, so when the set's join completes (on every member
# at the same point) the counter restarts at the next join epoch, k << 32 after the k-th join —
# past any n a rank reached before, so a handle still unsynchronized from before the join keeps
# a name no new op takes. numpy_ops counts the same way.

_noname_counters = {}  # process set id -> itertools.count
_join_epochs = {}      # process set id -> joins completed


def rebase_noname_counter(set_id):
    """The set's join completed on every member: restart its counter at the next join epoch
    (Note [Noname counters])."""
    _join_epochs[set_id] = _join_epochs.get(set_id, 0) + 1
    _noname_counters.pop(set_id, None)  # op_name starts it again at the new epoch


def op_name(prefix, name, set_id=0):
    """Full core name for a user-supplied (or missing) tensor name; an unnamed op takes the
    next n of its process set's counter (Note [Noname counters])."""
    if name is None or name == '':
        counter = _noname_counters.get(set_id)
        if counter is None:
            counter = itertools.count(_join_epochs.get(set_id, 0) << 32)
            _noname_counters[set_id] = counter
        return '%s.noname.%d' % (prefix, next(counter))
    return '%s.%s' % (prefix, name)


# The C path of allreduce (bindings/torch_api.cc) takes exact Tensors and Parameters only.
_core.torch_setup(torch.Tensor, torch.nn.Parameter, torch.strided, _DTYPE_CODES, op_name)


# ---------------------------------------------------------------------------------------------
# Handle table

class _Pending:
    """An op in flight: its core handles, what must stay alive, and how to build the output.
    (A group of the C path is a ``grouped.Group``: the same keep, pending, wait, output.)"""
    __slots__ = ('core_handles', 'finish', 'keep', 'results')

    def __init__(self, core_handles, keep, finish):
        self.core_handles = list(core_handles)
        self.results = {}      # index -> wait() result, filled as handles complete
        self.keep = keep       # tensors whose memory the core uses (Note [Handle lifetime])
        self.finish = finish   # callable(list of wait results) -> user-visible output

    def pending(self):
        """The core handles not waited for yet."""
        return [h for i, h in enumerate(self.core_handles) if i not in self.results]

    def wait(self):
        """Wait for every core handle; returns the first member's error (None when none
        failed). A KeyboardInterrupt, or any exception a signal handler raised while the op was
        still running, passes through with the record intact."""
        error = None
        for i, core_handle in enumerate(self.core_handles):
            if i in self.results:
                continue
            try:
                self.results[i] = _core.wait(core_handle)
            except (KeyboardInterrupt, SystemExit):
                raise  # still pending in the core: keep the record (Note [Handle lifetime])
            except Exception as exc:  # noqa: BLE001 - returned, raised after the group drained
                if _still_pending(core_handle):
                    raise  # a signal handler's exception cut the wait short: as Ctrl-C
                self.results[i] = None
                error = error or exc
        return error

    def output(self):
        return self.finish([self.results[i] for i in range(len(self.core_handles))])


def _still_pending(core_handle) -> bool:
    """True while the core still runs the op: a wait that raised without finishing it."""
    try:
        return not _core.poll(core_handle, False)
    except ValueError:  # released: the wait delivered the op's own error
        return False


# A handle is the op's first core handle, so it never collides with a handle of the C path
# (bindings/torch_api.cc), whose kept references live in the core's table instead of here.
_handle_map = {}
# The tensors of ops that failed: a CUDA op's queued device work may still touch them after its
# handle failed (the core waits only briefly for it), so they live until shutdown()/init(),
# which drain the device streams first.
_failed_keep = []


def _reset_handles():
    _handle_map.clear()
    _failed_keep.clear()
    _core.torch_release_kept()  # the C path's handles, likewise forgotten
    _noname_counters.clear()
    _join_epochs.clear()


_basics._per_world_resets.append(_reset_handles)  # every init() and shutdown(), whichever API


def _internal_error(exc):
    if isinstance(exc, HorovodInternalError):
        return exc
    err = HorovodInternalError(str(exc))
    err.__cause__ = exc
    return err


def output_for(tensor):
    """A fresh contiguous tensor like ``tensor``, on its device, for an out-of-place result
    (an invalid input is returned as is, for check_tensor to reject with its message)."""
    # empty_like: a third of torch.empty(shape, dtype=...)'s cost per call
    return torch.empty_like(tensor, memory_format=torch.contiguous_format) \
        if isinstance(tensor, torch.Tensor) and tensor.layout == torch.strided else tensor


def submit(ops, keep, finish, waited=False):
    """Enqueue one op (a tuple of ``_core.enqueue`` arguments) or several as one group.

    ``waited``: the caller synchronizes on the handle next, and that wait runs the op (or the
    group) on the calling thread (Note [Caller drives] in the core), so the core's thread is
    not woken.
    Returns the user-visible handle. ValueError/TypeError from the core (duplicate name, bad
    splits, bad root, unknown process set) pass through unchanged; any other RuntimeError
    becomes HorovodInternalError, as in Horovod.
    """
    if not _core.is_initialized():
        raise HorovodInternalError(_NOT_INITIALIZED)  # Horovod's type for ops before init()
    try:
        if len(ops) == 1:
            enqueue = _core.enqueue_for_wait if waited else _core.enqueue
            core_handles = [enqueue(*ops[0])]
        else:
            core_handles = list(_core.enqueue_group(list(ops), waited))
    except (ValueError, TypeError):
        raise
    except RuntimeError as exc:
        raise _internal_error(exc) from None
    handle = core_handles[0]
    _handle_map[handle] = _Pending(core_handles, keep, finish)
    return handle


def poll(handle):
    """True when the asynchronous op behind ``handle`` has finished; never blocks.

    After ``poll()`` returns True, ``synchronize()`` returns without blocking, and the op's
    tensor names are free for new ops (Note [Name lifetime] in csrc/runtime/handle_table.h).
    """
    record = _handle_map.get(handle)
    if record is None:
        if _core.torch_kept(handle):
            return _core.poll(handle)
        raise ValueError('Handle %s was not created or has been cleared.' % (handle,))
    pending = record.pending()
    if len(pending) == 1:
        return _core.poll(pending[0])
    # A group's names are freed together, once every member has finished.
    if not all(_core.poll(h, False) for h in pending):
        return False
    for h in pending:
        _core.poll(h)
    return True


def synchronize(handle):
    """Wait for an asynchronous op and return its output.

    Returns None for an unknown (or already synchronized) handle, a tensor for most ops and
    a tuple ``(output, received_splits)`` for alltoall. Raises HorovodInternalError when the
    op failed (mismatch across ranks, lost peer, timeout, abort, shutdown).
    """
    record = _handle_map.get(handle)
    if record is None:
        return _core.torch_synchronize(handle)  # the C path's, or None when unknown
    error = record.wait()  # a KeyboardInterrupt leaves the record (Note [Handle lifetime])
    del _handle_map[handle]
    if error is not None:
        if isinstance(error, (ValueError, TypeError)):
            raise error
        _failed_keep.append(record.keep)
        raise _internal_error(error)
    return record.output()


def join(device=-1):
    """Signal that this rank has no more data; block until every rank has joined.

    While joined, this rank contributes zeros to the other ranks' allreduces (which still
    divide by the full set size for Average). ``device`` (Horovod's argument: -1 for the CPU,
    a CUDA ordinal or device) is where those zeros live when the others reduce CUDA tensors.
    Returns the global rank that joined last.
    """
    op = (JOIN, 'join', _DTYPE_CODES[torch.int32], (), 0, 0, Sum, 1.0, 1.0, 0,
          0, None, devices.join_device(device))
    handle = submit([op], None, lambda results: results[0])
    result = synchronize(handle)
    rebase_noname_counter(0)  # Note [Noname counters]
    return int(result) if result is not None else -1


def barrier(process_set=global_process_set):
    """Block until every rank of ``process_set`` has reached the barrier."""
    op = (BARRIER, 'barrier', _DTYPE_CODES[torch.int32], (), 0, 0, Sum, 1.0, 1.0, 0,
          set_id(process_set), None, -1)
    synchronize(submit([op], None, lambda results: None))
