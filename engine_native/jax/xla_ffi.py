"""The collectives inside ``jax.jit`` as XLA FFI custom calls, where the core was built with
jaxlib's headers (issue #37): allreduce, grouped_allreduce, broadcast, allgather,
grouped_allgather, reducescatter and alltoall (equal splits).

Each becomes one custom call to the core's handler ``hvd_collective`` (bindings/jax_ffi.cc),
which XLA:CPU calls with the program's own operand and result buffers: the handler enqueues the
core's op on them and waits, with no Python and no GIL. Allreduce and broadcast read operand i
and write result i; allgather, reducescatter and alltoall write the core's output buffer, which
the handler copies into the result after checking its shape (the traced one needs the same
shape on every rank). An ordered io_callback, the other path (``traced_ops``), took
the GIL, ran numpy_ops on views and copied each result into XLA's buffer.

``jit_path()`` says which path this build takes: "xla_ffi" when ``_core.xla_ffi_targets()``
named the handler (the core was compiled with jaxlib's include folder: setup.py), else
"io_callback" for every collective.

Note [Ordered FFI collectives]
A custom call with a side effect is never dropped, but XLA:CPU orders custom calls only by the
buffers they share (its thunk executor runs independent thunks concurrently, and the scheduler
may put them in any order): two independent collectives of one program could start in
different orders on two ranks, and each handler would block its XLA thread on an op the other
rank has not started (a deadlock). So every call takes and returns JAX's ordered-IO token, the
one ordered io_callbacks thread (``jax._src.callback``'s ``OrderedIOEffect``; private, jax
0.10.2): XLA sees a chain of data dependencies through every collective of the program, FFI
and io_callback alike, in program order, and JAX carries the token from one execution to the
next. tests/frameworks/test_jax_ops.py has three independent collectives in one program.

Note [A failed collective and JAX's token]
JAX hands each program's ordered-effect token to the next program (``dispatch.runtime_tokens``,
per thread). A program that XLA ran asynchronously (a larger one, on XLA's threads) and that
failed leaves its error in that token, and JAX raised it again at the dispatch of every later
program with an ordered effect, even after ``hvd.shutdown()`` and ``hvd.init()`` (seen with
jax 0.10.2: a dtype mismatch inside a jitted step, which the core does not keep, made every later
jitted collective fail with it; a small program, run on the caller's thread, raises before JAX
keeps its token). That failure was raised where the program's results are read; so a token
holding an engine_native collective's failure is dropped when the next program asks for it (JAX
then starts a fresh one, as for its first program), and at every init() and shutdown() for the
calling thread (``jax.effects_barrier()`` and JAX's exit would raise it again). Any other
failure stays in the token.

Note [Compiled programs with ordered collectives]
``jax.jit(f).lower(x).compile()`` gives a program that JAX calls through its C++ fast path from
the second call on, unless the program has unordered effects or host callbacks; jit itself
also leaves out programs with ordered effects (jax 0.10.2, pxla.MeshExecutable.create_cpp_call
against pjit._get_fastpath_data). An io_callback has a host callback; these custom calls have
only the ordered effect, so the fast path called them without their token: "Execution supplied
1 arguments but compiled program expected 2" from the second call. Such a program keeps JAX's
Python call path (what the first call took), as under jit.
"""
from __future__ import annotations

import dataclasses
import os

import jax
import numpy as np
from jax.extend.core import Primitive
from jax.interpreters import mlir

from engine_native import _core, basics

_TARGET = "hvd_collective"
ALLREDUCE, ALLGATHER, BROADCAST, ALLTOALL, REDUCESCATTER = 0, 1, 2, 3, 4  # coord::OpType

# Why jit takes the io_callback path, or "" when it takes the custom calls.
_why_not = ""
try:  # JAX's private names (Note [Ordered FFI collectives]): another jax may not have them
    from jax._src import callback as _jax_callback
    from jax._src import core as _jax_core
    from jax._src import dispatch as _jax_dispatch
    _ORDERED = _jax_callback._OrderedIOEffect
    _ShapedArray, _abstract_token = _jax_core.ShapedArray, _jax_core.abstract_token
    from jax._src.interpreters import pxla as _pxla
    _TokenSet = _jax_dispatch.RuntimeTokenSet
    _jax_token_input = _TokenSet.get_token_input
    _jax_cpp_call = _pxla.MeshExecutable.create_cpp_call
except (ImportError, AttributeError) as exc:
    _why_not = f"this jax {jax.__version__} lacks the ordered-IO effect the calls use ({exc})"
_targets = _core.xla_ffi_targets()
if not _targets:
    _why_not = _why_not or "the core was built without jaxlib's headers (setup.py)"
elif os.environ.get("HVD_JAX_JIT_PATH", "") == "io_callback":
    _why_not = "HVD_JAX_JIT_PATH=io_callback"
if not _why_not:
    for _name, _capsule in _targets.items():
        jax.ffi.register_ffi_target(_name, _capsule, platform="cpu")


def _ours(error: Exception) -> bool:
    """A failure of an engine_native.jax collective (the FFI handler's message, or an
    io_callback's traceback through engine_native)."""
    return isinstance(error, jax.errors.JaxRuntimeError) and "engine_native" in str(error)


def _token_input(self, effect, devices):
    """JAX's ``RuntimeTokenSet.get_token_input``, past a token that holds an engine_native
    collective's failure (Note [A failed collective and JAX's token])."""
    try:
        return _jax_token_input(self, effect, devices)
    except jax.errors.JaxRuntimeError as exc:
        if not _ours(exc) or self.current_tokens.pop(effect, None) is None:
            raise
    return _jax_token_input(self, effect, devices)


def drop_failed_tokens() -> None:
    """This thread's JAX tokens that hold an engine_native collective's failure, dropped
    (Note [A failed collective and JAX's token]): at init() and shutdown() on this path, and by
    engine_native.keras's elastic reset on either path. A no-op on a jax without the names."""
    tokens = getattr(globals().get("_jax_dispatch"), "runtime_tokens", None)
    if tokens is None:
        return
    for table in (tokens.current_tokens, tokens.output_runtime_tokens):
        for key, token in list(table.items()):
            try:
                token.block_until_ready()
            except jax.errors.JaxRuntimeError as exc:
                if _ours(exc):
                    del table[key]


def _create_cpp_call(self, params):
    """JAX's ``MeshExecutable.create_cpp_call``, declining (None: the Python call path) for a
    program with an ordered effect (Note [Compiled programs with ordered collectives])."""
    if isinstance(self.unsafe_call, _pxla.ExecuteReplicated) and self.unsafe_call.ordered_effects:
        return None
    return _jax_cpp_call(self, params)


if not _why_not:
    _TokenSet.get_token_input = _token_input
    _pxla.MeshExecutable.create_cpp_call = _create_cpp_call
    basics._per_world_resets.append(drop_failed_tokens)


def jit_path() -> str:
    """"xla_ffi": the collectives inside jax.jit are XLA custom calls into the core;
    "io_callback": every collective inside jit is an ordered io_callback, because the core was
    built without jaxlib's headers, this jax lacks what the calls use, or HVD_JAX_JIT_PATH is
    "io_callback" (``jit_path_reason()`` says which; docs/pages/jax.md)."""
    return "io_callback" if _why_not else "xla_ffi"


def jit_path_reason() -> str:
    """Why ``jit_path()`` is "io_callback"; "" when it is "xla_ffi"."""
    return _why_not


collective_p = Primitive("hvd_collective")
collective_p.multiple_results = True


def _abstract_eval(*avals, results, **attrs):
    return [_ShapedArray(shape, dtype) for shape, dtype in results], {_ORDERED}


if not _why_not:
    collective_p.def_effectful_abstract_eval(_abstract_eval)


def _lowering(ctx, *operands, results, **attrs):
    """One custom call: token and operands in, token and results out (Note [FFI call layout]
    in bindings/jax_ffi.cc)."""
    token = ctx.tokens_in.get(_ORDERED)
    with_token = dataclasses.replace(
        ctx, avals_in=[_abstract_token, *ctx.avals_in],
        avals_out=[_abstract_token, *ctx.avals_out])
    call = jax.ffi.build_ffi_lowering_function(_TARGET, has_side_effect=True)(
        with_token, token, *operands, **attrs)
    ctx.set_tokens_out(ctx.tokens_in.update_tokens(mlir.TokenSet({_ORDERED: call.results[0]})))
    return call.results[1:]


if not _why_not:
    mlir.register_lowering(collective_p, _lowering, platform="cpu")


def collective(tracers, kind: int, full_name: str, first: int, results=None, reduce_op: int = 0,
               prescale: float = 1.0, postscale: float = 1.0, root_rank: int = 0,
               process_set: int = 0) -> list:
    """``kind`` (a coord::OpType above) of ``tracers`` as one custom call. ``results``: the
    results' ``jax.ShapeDtypeStruct``s (None: the operands' shapes and dtypes, as allreduce and
    broadcast give; alltoall: its rows, then its received splits). ``first`` -1: one op named
    ``full_name``; else a group, member i named ``<full_name>_<first + i>of<n>`` (the numpy
    API's names)."""
    results = tuple((tuple(r.shape), np.dtype(r.dtype)) for r in (results or tracers))
    return collective_p.bind(*tracers, results=results, op=np.int64(kind), name=full_name,
                             first=np.int64(first),
                             reduce_op=np.int64(reduce_op), prescale=np.float64(prescale),
                             postscale=np.float64(postscale), root_rank=np.int64(root_rank),
                             process_set=np.int64(process_set))
