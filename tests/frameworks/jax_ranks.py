"""Launching ranks for the engine_native.jax tests: run_ranks with XLA's quick compilation (and
the dtypes and value check the rank-side checks share).

XLA's CPU backend optimises hard by default: a jitted MLP training step took ~13 s of a rank
to compile and run, ~5 s at optimisation level 0. These tests check values across ranks,
not XLA's code, so their ranks compile fast (XLA_FLAGS is read when JAX starts its backend,
after the rank was forked, so forking from the warm zygote still works).
"""
from multiproc.harness import run_ranks

DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
          "uint8", "bool"]

QUICK_XLA = {"XLA_FLAGS": "--xla_backend_optimization_level=0 "
                          "--xla_llvm_disable_expensive_passes=true"}


def run_jax_ranks(fn, np, args=(), timeout=120, env=None, check=True):
    """``run_ranks(fn, np)`` with every rank compiling at XLA's lowest optimisation level."""
    return run_ranks(fn, np, args=args, env={**QUICK_XLA, **(env or {})}, timeout=timeout,
                     check=check)


def on_xla_threads(jnp, v):
    """``v`` (a square matrix) through 24 matmuls: a program XLA:CPU runs on its own threads,
    asynchronously (the caller waits in block_until_ready), where a lone collective runs on
    the caller's thread (measured with jaxlib 0.10.2)."""
    for _ in range(24):
        v = jnp.tanh(v @ v.T)
    return v


def expect(failures, what, got, want):
    """``got`` equal to ``want`` in shape, dtype and value; else a line in ``failures``."""
    import numpy as np
    got_np = np.asarray(got)
    want = np.asarray(want)
    if got_np.shape != want.shape or got_np.dtype != want.dtype or not np.array_equal(
            got_np.astype(np.float64), want.astype(np.float64)):
        failures.append(f"{what}: got {got_np.dtype}{got_np.shape} {got_np.ravel()[:6]}, "
                        f"want {want.dtype}{want.shape} {want.ravel()[:6]}")
