"""Launching ranks for the engine_native.jax tests: run_ranks with XLA's quick compilation.

XLA's CPU backend optimises hard by default: a jitted MLP training step took ~13 s of a rank
to compile and run, ~5 s at optimisation level 0. These tests check values across ranks,
not XLA's code, so their ranks compile fast (XLA_FLAGS is read when JAX starts its backend,
after the rank was forked, so forking from the warm zygote still works).
"""
from multiproc.harness import run_ranks

QUICK_XLA = {"XLA_FLAGS": "--xla_backend_optimization_level=0 "
                          "--xla_llvm_disable_expensive_passes=true"}


def run_jax_ranks(fn, np, args=(), timeout=120, env=None):
    """``run_ranks(fn, np)`` with every rank compiling at XLA's lowest optimisation level."""
    return run_ranks(fn, np, args=args, env={**QUICK_XLA, **(env or {})}, timeout=timeout)
