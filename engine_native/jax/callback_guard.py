"""Refuse a collective run from inside ``jax.pure_callback``.

JAX treats a pure callback as a pure function: under ``jit`` it may drop the call when its
result is unused, run it once for two identical calls, or move it (XLA reorders side-effect
free work). A collective there would run on some ranks and not others, or in another order,
and hang or mix up tensors. The binding's own calls inside ``jit`` are XLA FFI custom calls or
``jax.experimental.io_callback(..., ordered=True)`` (``traced_ops``), which JAX runs exactly
once, in program order.

What is detected: an eager collective whose call stack holds the frame of JAX's
``pure_callback`` implementation (a function named ``pure_callback_impl`` in
``jax/_src/callback.py``; jax 0.10.2), whether the pure callback was jitted or not. Not
detected: ``io_callback(..., ordered=False)`` and ``jax.debug.callback`` (JAX deletes the
``ordered`` flag before it calls the host function, so the frame cannot tell them from an
ordered call); their order is the caller's responsibility.
"""
import os
import sys

_PURE_CALLBACK_FRAME = ("pure_callback_impl", "callback.py")


def _is_pure_callback(code) -> bool:
    return (code.co_name == _PURE_CALLBACK_FRAME[0]
            and os.path.basename(code.co_filename) == _PURE_CALLBACK_FRAME[1])


def refuse_inside_pure_callback(op: str) -> None:
    """Raise RuntimeError when the caller runs inside a ``jax.pure_callback`` host function."""
    frame = sys._getframe(2)  # the caller of the collective; ours are not callbacks
    while frame is not None:
        if _is_pure_callback(frame.f_code):
            raise RuntimeError(
                f"{op}() was called inside jax.pure_callback: JAX may drop, merge or reorder "
                f"a pure callback, so ranks would disagree on which collectives run. Call "
                f"engine_native.jax.{op}() on the traced array inside jax.jit instead (it uses "
                f"an ordered io_callback), or use jax.experimental.io_callback(..., "
                f"ordered=True) for your own host function")
        frame = frame.f_back
