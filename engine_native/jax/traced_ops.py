"""The collectives on traced arrays (inside ``jax.jit``): XLA FFI custom calls or ordered host
callbacks.

Which path each op takes (``engine_native.jax.jit_path()`` says which this build has): every
op here is an XLA FFI custom call into the core (``xla_ffi``: no Python; allgather,
reducescatter and alltoall copy the core's output into XLA's buffer) when the core was built
with jaxlib's headers and JAX's default backend is the CPU; otherwise each op is one
``jax.experimental.io_callback(..., ordered=True)``:
JAX runs it exactly once per execution, in program order, never dropped or merged (a pure
callback may be; see ``callback_guard``). That host function runs the numpy API's synchronous
op on the buffers JAX passes (views on the CPU); JAX copies the returned array into the
program's output buffer. Both paths thread the same ordered-effect token, so a program mixing
them runs all its collectives in program order (Note [Ordered FFI collectives] in xla_ffi).

Result shapes must be known when tracing, so: allgather (and each array of a
grouped_allgather) assumes the same first dimension on every rank (checked when it runs),
alltoall takes equal splits only, reducescatter gives this rank its Horovod share of the rows.

Names (Note [Traced names]): an op without ``name=`` is named ``<op>.jit.<n>`` with n counted
when tracing, so every rank, tracing the same functions in the same order, gives the k-th
traced op the same name, whichever thread runs the op and whatever eager ops run
meanwhile (the numpy API's unnamed counters advance at submission, which would race with
JAX's asynchronous dispatch). A compiled function reuses its names at each call: its
collectives run one after the other (ordered), so a name is never in flight twice.

Transformations: ``vmap`` and ``grad``/``jvp``/``vjp`` of a collective raise a ValueError
saying what to do (JAX itself has no batching or differentiation rule for an ordered
callback or the custom call): ``custom_vmap`` and ``custom_jvp`` wrappers whose rules raise.
"""
from __future__ import annotations

import itertools
from typing import Callable, Optional, Sequence

import jax
import numpy as np
from jax.experimental import io_callback

from engine_native import _core, basics, numpy_ops
from engine_native._core import HorovodInternalError
from engine_native._dtypes import check_adasum, check_reducescatter_op
from engine_native.basics import ProcessSet
from engine_native.jax import arrays, xla_ffi

_trace_counter = itertools.count()


def _restart_names() -> None:
    global _trace_counter
    _trace_counter = itertools.count()  # a new world: every rank counts from 0 again


basics._per_world_resets.append(_restart_names)


def traced_name(name: Optional[str]) -> str:
    """The op's name suffix under jit (Note [Traced names]); numpy_ops prefixes ``<op>.``."""
    return name if name else f"jit.{next(_trace_counter)}"


def _refusing_transforms(fn: Callable, op: str) -> Callable:
    """``fn`` whose vmap and derivatives raise errors naming ``op`` and the way out."""
    batched = jax.custom_batching.custom_vmap(fn)

    @batched.def_vmap
    def _vmap_rule(axis_size, in_batched, *args):
        raise ValueError(f"{op}() cannot run under jax.vmap: it is one host call per program "
                         f"execution. Call it on the whole batched array (outside vmap), or "
                         f"loop over the batch")

    differentiable = jax.custom_jvp(batched)

    @differentiable.defjvp
    def _jvp_rule(primals, tangents):
        raise ValueError(f"{op}() cannot be differentiated (jax.grad/jvp/vjp): compute the "
                         f"gradients first, then reduce them, e.g. grads = jax.grad(loss)(params);"
                         f" grads = hvd.allreduce_pytree(grads), or chain "
                         f"hvd.average_gradients() into the optax optimizer")
    return differentiable


def ordered_call(op: str, host_fn: Callable, result_shapes, tracers: Sequence):
    """Run ``host_fn(*numpy arrays)`` once, in program order, returning ``result_shapes``.

    Its waits are labelled as inside jit: the op cannot stay pending once the callback returns
    (its operands are views of XLA's buffers), so Ctrl-C aborts it instead of interrupting the
    wait (Note [Ctrl-C inside jax.jit] in bindings/jit_interrupt.h); a failure that leaves the
    core failed says what to do, as the XLA FFI path's do."""
    def callback(*args):
        _core.jit_callback_label(f"{op} (io_callback)")
        try:
            return host_fn(*[np.asarray(a) for a in args])
        except HorovodInternalError as exc:
            failure = _core.core_failure()  # None, or (message, what to do)
            if failure is None:
                raise
            raise HorovodInternalError(f"{exc}{failure[1]}") from None
        finally:
            _core.jit_callback_label(None)
    return _refusing_transforms(
        lambda *xs: io_callback(callback, result_shapes, *xs, ordered=True), op)(*tracers)


def _check(tracer, op: str, name: Optional[str], process_set: ProcessSet,
           reduce_op: Optional[int] = None) -> None:
    """What can be checked when tracing, before a name is drawn (a failure on one rank must
    not shift the names of the next ops): a supported dtype, a registered process set, and
    Adasum's rules (what the core would refuse only when the program runs: engine_native.torch
    and the eager path refuse it before submitting)."""
    arrays.check_dtype(tracer.dtype, op, name or "unnamed")
    numpy_ops._set_id(process_set, op)
    if op == "reducescatter":
        check_reducescatter_op(reduce_op)
    elif reduce_op is not None:
        check_adasum(reduce_op, op, process_set.size(), tracer.dtype, name or "unnamed")


def _like(tracer) -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tracer.shape, tracer.dtype)


def _compiled() -> bool:
    """True when this trace's collectives are XLA FFI custom calls: the core has the handler
    and the program is for the CPU (the handler's only platform)."""
    return xla_ffi.jit_path() == "xla_ffi" and jax.default_backend() == "cpu"


def ffi_call(op: str, tracers: Sequence, **attrs) -> list:
    """``xla_ffi.collective(tracers, **attrs)``, its vmap and derivatives refused."""
    return _refusing_transforms(lambda *xs: xla_ffi.collective(xs, **attrs), op)(*tracers)


def allreduce(tensor, op, name, prescale_factor, postscale_factor, process_set):
    _check(tensor, "allreduce", name, process_set, op)
    name = traced_name(name)
    if _compiled():
        return ffi_call("allreduce", [tensor], kind=xla_ffi.ALLREDUCE,
                        full_name=f"allreduce.{name}", first=-1, reduce_op=op,
                        prescale=prescale_factor, postscale=postscale_factor,
                        process_set=numpy_ops._set_id(process_set, "allreduce"))[0]
    return ordered_call("allreduce", lambda x: numpy_ops.allreduce(
        x, op, name, prescale_factor, postscale_factor, process_set), _like(tensor), [tensor])


def _grouped(op: str, tensors, name, process_set, run: Callable, result_shape: Callable,
             reduce_op: Optional[int] = None):
    """One ordered callback for a grouped ``op``: ``run(numpy arrays, name)`` runs the numpy
    API's grouped op; ``result_shape(tracer)`` is each result's shape. The grouped ops share
    this: they differ only in ``run`` and ``result_shape``."""
    for t in tensors:
        _check(t, op, name, process_set, reduce_op)
    shapes = [result_shape(t) for t in tensors]
    name = traced_name(name)
    return ordered_call(op, lambda *xs: run(list(xs), name), shapes, list(tensors))


def grouped_allreduce(tensors, op, name, prescale_factor, postscale_factor, process_set):
    if not _compiled() or not tensors:
        return _grouped("grouped_allreduce", tensors, name, process_set,
                        lambda xs, full: numpy_ops.grouped_allreduce(
                            xs, op, full, prescale_factor, postscale_factor, process_set),
                        _like, op)
    for t in tensors:
        _check(t, "grouped_allreduce", name, process_set, op)
    name = traced_name(name)
    return list(ffi_call("grouped_allreduce", list(tensors), kind=xla_ffi.ALLREDUCE,
                         full_name=f"grouped_allreduce.{name}", first=0, reduce_op=op,
                         prescale=prescale_factor, postscale=postscale_factor,
                         process_set=numpy_ops._set_id(process_set, "grouped_allreduce")))


def broadcast(tensor, root_rank, name, process_set):
    _check(tensor, "broadcast", name, process_set)
    name = traced_name(name)
    if _compiled():
        return ffi_call("broadcast", [tensor], kind=xla_ffi.BROADCAST,
                        full_name=f"broadcast.{name}", first=-1, root_rank=int(root_rank),
                        process_set=numpy_ops._set_id(process_set, "broadcast"))[0]
    return ordered_call("broadcast", lambda x: numpy_ops.broadcast(
        x, int(root_rank), name, process_set), _like(tensor), [tensor])


def _rows(tensor, op: str) -> int:
    if tensor.ndim == 0:
        raise ValueError(f"{op}(): expected an array with a first dimension, got a scalar; "
                         f"reshape it to (1,)")
    return tensor.shape[0]


def _gathered_like(tensor, op: str, process_set: ProcessSet) -> jax.ShapeDtypeStruct:
    """An allgather's result when every rank has ``tensor``'s shape (all jit can know)."""
    rows = _rows(tensor, op) * process_set.size()
    return jax.ShapeDtypeStruct((rows,) + tensor.shape[1:], tensor.dtype)


def _check_gathered(gathered, expected: jax.ShapeDtypeStruct, full_name: str):
    if gathered.shape[0] != expected.shape[0]:
        raise ValueError(f"allgather('{full_name}') inside jax.jit: the ranks' first "
                         f"dimensions differ ({gathered.shape[0]} rows in all, "
                         f"{expected.shape[0]} expected); a jitted allgather needs the same "
                         f"shape on every rank: call it outside jit for ragged inputs")
    return gathered


def allgather(tensor, name, process_set):
    _check(tensor, "allgather", name, process_set)
    shape = _gathered_like(tensor, "allgather", process_set)
    name = traced_name(name)
    if _compiled():
        return ffi_call("allgather", [tensor], kind=xla_ffi.ALLGATHER,
                        full_name=f"allgather.{name}", first=-1, results=[shape],
                        process_set=numpy_ops._set_id(process_set, "allgather"))[0]
    return ordered_call("allgather", lambda x: _check_gathered(
        numpy_ops.allgather(x, name, process_set), shape, f"allgather.{name}"), shape, [tensor])


def grouped_allgather(tensors, name, process_set):
    if _compiled():
        for t in tensors:
            _check(t, "grouped_allgather", name, process_set)
        shapes = [_gathered_like(t, "grouped_allgather", process_set) for t in tensors]
        name = traced_name(name)
        return list(ffi_call("grouped_allgather", list(tensors), kind=xla_ffi.ALLGATHER,
                             full_name=f"grouped_allgather.{name}", first=0, results=shapes,
                             process_set=numpy_ops._set_id(process_set, "grouped_allgather")))

    def run(xs, full):
        gathered = numpy_ops.grouped_allgather(xs, full, process_set)
        return [_check_gathered(g, _gathered_like(x, "grouped_allgather", process_set),
                                f"grouped_allgather.{full}_{i}of{len(xs)}")
                for i, (g, x) in enumerate(zip(gathered, xs))]
    return _grouped("grouped_allgather", tensors, name, process_set, run,
                    lambda t: _gathered_like(t, "grouped_allgather", process_set))


def reducescatter(tensor, op, name, process_set, prescale_factor, postscale_factor):
    _check(tensor, "reducescatter", name, process_set, op)
    rows, n, me = _rows(tensor, "reducescatter"), process_set.size(), process_set.rank()
    name = traced_name(name)
    mine = rows // n + (1 if me < rows % n else 0)  # Horovod: the first rows % n get one more
    shape = jax.ShapeDtypeStruct((mine,) + tensor.shape[1:], tensor.dtype)
    if _compiled():
        return ffi_call("reducescatter", [tensor], kind=xla_ffi.REDUCESCATTER,
                        full_name=f"reducescatter.{name}", first=-1, results=[shape],
                        reduce_op=op, prescale=prescale_factor, postscale=postscale_factor,
                        process_set=numpy_ops._set_id(process_set, "reducescatter"))[0]
    return ordered_call("reducescatter", lambda x: numpy_ops.reducescatter(
        x, op, name, process_set, prescale_factor, postscale_factor), shape, [tensor])


def alltoall(tensor, splits, name, process_set):
    if splits is not None:
        raise ValueError("alltoall(splits=...) inside jax.jit: the received sizes are not known "
                         "when tracing; pass splits=None (equal parts, the same shape on every "
                         "rank) or call alltoall outside jit")
    _check(tensor, "alltoall", name, process_set)
    rows, n = _rows(tensor, "alltoall"), process_set.size()
    if rows % n:
        raise ValueError(f"alltoall(): {rows} rows do not split equally over {n} ranks; pass "
                         f"splits= (outside jit)")
    name = traced_name(name)
    split_dtype = np.dtype(jax.numpy.int64 if jax.config.jax_enable_x64 else np.int32)
    shapes = (_like(tensor), jax.ShapeDtypeStruct((n,), split_dtype))
    if _compiled():
        return tuple(ffi_call("alltoall", [tensor], kind=xla_ffi.ALLTOALL,
                              full_name=f"alltoall.{name}", first=-1, results=shapes,
                              process_set=numpy_ops._set_id(process_set, "alltoall")))

    def host(x):
        received, received_splits = numpy_ops.alltoall(x, None, name, process_set)
        if received.shape != tensor.shape:
            raise ValueError(f"alltoall('alltoall.{name}') inside jax.jit: received "
                             f"{received.shape[0]} rows, {rows} expected; a jitted alltoall "
                             f"needs the same shape on every rank: call it outside jit")
        return received, received_splits.astype(split_dtype)
    return ordered_call("alltoall", host, shapes, [tensor])
