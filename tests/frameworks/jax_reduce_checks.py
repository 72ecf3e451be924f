"""Rank-side checks of engine_native.jax's reduce ops besides Sum (test_jax_ops.py checks Sum
with every collective): Min, Max, Product, Average and Adasum by value, eagerly and inside
jax.jit, and Adasum refused where engine_native.torch refuses it. Each check appends what
failed to ``failures``; test_jax_ops.py runs them in its rank runs, on 2 and 3 ranks.
"""
from .jax_ranks import DTYPES
from .jax_ranks import expect as _expect


FLOATS = ("float16", "bfloat16", "float32", "float64")


def _reductions(hvd, ps, adasum: bool):
    """allreduce with every other reduce op on each dtype's arrays: Min, Max and Product
    (grouped, for the group paths; bool: and, or, and), Average and Adasum (grouped too) on
    the floating-point ones, Adasum where the set's size is a power of two. A dict per dtype;
    run eagerly and jitted as ONE program, as _all_ops."""
    def ops(inputs):
        out = {}
        for dt, (x, parallel) in inputs.items():
            out[dt] = {"min": hvd.allreduce(x, op=hvd.Min, process_set=ps),
                       "max": hvd.allreduce(x, op=hvd.Max, process_set=ps),
                       "product": hvd.grouped_allreduce([x, x[:1]], op=hvd.Product,
                                                        process_set=ps)}
            if dt in FLOATS:
                out[dt]["average"] = hvd.allreduce(x, op=hvd.Average, process_set=ps)
                if adasum:
                    out[dt]["adasum"] = hvd.grouped_allreduce(
                        [parallel, parallel[:1]], op=hvd.Adasum, process_set=ps)
        return out
    return ops


def check_reduce_ops(hvd, jax, np, failures, ps, label, dtypes=DTYPES):
    """Every reduce op the binding offers besides Sum (_check_collectives) by value, eagerly and
    inside jax.jit; where the set's size is not a power of two, Adasum refused before anything
    is submitted, as engine_native.torch refuses it (AdasumSizeError: a ValueError and
    Horovod's NotImplementedError), eagerly and when tracing."""
    import jax.numpy as jnp
    n, me = ps.size(), ps.rank()
    adasum = n & (n - 1) == 0
    base = np.arange(6).reshape(3, 2)
    # 1..5 (products of 3 ranks up to 60: exact in int8); bool: 0/1
    every = {dt: [((base + q) % 2 if dt == "bool" else base % 3 + q + 1).astype(jnp.dtype(dt))
                  for q in range(n)] for dt in dtypes}
    # rank q's Adasum input is (q + 1) v: parallel vectors, whose Adasum at 2 ranks is
    # (1 - 2|v|^2 / 2|v|^2) v + (1 - 2|v|^2 / 8|v|^2) 2v = 1.5 v, exact in every float type
    inputs = {dt: (jnp.asarray(every[dt][me]),
                   jnp.asarray((base + 1) * (me + 1), jnp.dtype(dt))) for dt in dtypes}
    ops = _reductions(hvd, ps, adasum)
    for mode, results in (("eager", ops(inputs)), ("jit", jax.jit(ops)(inputs))):
        for dt, got in results.items():
            tag, every_dt = f"{label}.{mode}.{dt}", every[dt]
            low, high = np.min(every_dt, axis=0), np.max(every_dt, axis=0)
            product = np.prod(np.stack(every_dt), axis=0).astype(every_dt[0].dtype)
            if dt == "bool":
                product = np.all(every_dt, axis=0)
            _expect(failures, f"{tag}.min", got["min"], low)
            _expect(failures, f"{tag}.max", got["max"], high)
            _expect(failures, f"{tag}.product.0", got["product"][0], product)
            _expect(failures, f"{tag}.product.1", got["product"][1], product[:1])
            if "average" in got:  # (q + b) summed over the ranks, over n: exact in halves
                _expect(failures, f"{tag}.average", got["average"],
                        (base % 3 + (n + 1) / 2).astype(every_dt[0].dtype))
            if "adasum" in got:
                want = ((base + 1) * 1.5).astype(every_dt[0].dtype)
                _expect(failures, f"{tag}.adasum.0", got["adasum"][0], want)
                _expect(failures, f"{tag}.adasum.1", got["adasum"][1], want[:1])
    if adasum:
        return
    x = jnp.ones(4, jnp.float32)
    for mode, call in (("eager", lambda: hvd.allreduce(x, op=hvd.Adasum, process_set=ps)),
                       ("eager.grouped", lambda: hvd.grouped_allreduce(
                           [x], op=hvd.Adasum, process_set=ps)),
                       ("jit", lambda: jax.jit(lambda v: hvd.allreduce(
                           v, op=hvd.Adasum, process_set=ps))(x)),
                       ("jit.int32", lambda: jax.jit(lambda v: hvd.allreduce(
                           v, op=hvd.Adasum, process_set=ps))(x.astype(jnp.int32)))):
        try:
            call()
            failures.append(f"{label}.adasum.{mode}: {n} ranks, no error")
        except (ValueError, NotImplementedError) as exc:
            if (not isinstance(exc, hvd.AdasumSizeError) or not isinstance(exc, ValueError)
                    or not isinstance(exc, NotImplementedError)
                    or f"non-power of 2 ranks is not supported yet (the process set has {n} "
                       f"ranks)" not in str(exc)):
                failures.append(f"{label}.adasum.{mode}: {type(exc).__mro__}: {exc}")
