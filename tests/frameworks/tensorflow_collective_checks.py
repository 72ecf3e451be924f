"""Rank-side checks of engine_native.tensorflow's collectives by value: every op and dtype
(grouped_allgather, Product and Adasum too), eagerly and inside tf.function, process sets,
IndexedSlices, broadcast_variables, program order inside one tf.function, barrier() and
join() as engine_native.torch's, and bad input (an error on every rank, then the next op
works).

Each check appends what failed to ``failures``; test_tensorflow_binding.py runs them.
"""
DTYPES = ["float16", "bfloat16", "float32", "float64", "int8", "int16", "int32", "int64",
          "uint8", "bool"]


def _expect(failures, what, got, want, tol=0.0):
    import numpy as np
    got_np, want = np.asarray(got), np.asarray(want)
    if got_np.shape != want.shape or got_np.dtype != want.dtype or not np.allclose(
            got_np.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol):
        failures.append(f"{what}: got {got_np.dtype}{got_np.shape} {got_np.ravel()[:6]}, "
                        f"want {want.dtype}{want.shape} {want.ravel()[:6]}")


def _data(q, rows, npdt):
    """Rank q's rows: small integers (exact in every dtype), 0/1 for bool."""
    import numpy as np
    base = (np.arange(rows * 2).reshape(rows, 2) + 3 * q) % 5
    return (base % 2 if npdt == np.bool_ else base).astype(npdt)


FLOATS = ("float16", "bfloat16", "float32", "float64")


def check_collectives(hvd, tf, np, failures, ps, label):
    """Every collective in every dtype on ``ps``, eagerly and inside one tf.function; Adasum
    where the set's size is a power of two (else refused as engine_native.torch refuses it)."""
    n, me = ps.size(), ps.rank()
    root = ps.ranks[-1]
    adasum = n & (n - 1) == 0
    for dt in DTYPES:
        tfdt = tf.as_dtype(dt)
        npdt = tfdt.as_numpy_dtype
        every = [_data(q, 3, npdt) for q in range(n)]
        op = hvd.Max if dt == "bool" else hvd.Sum
        reduced = np.any(every, axis=0) if dt == "bool" else np.sum(every, axis=0).astype(npdt)
        # 0..4 per rank: products of 3 ranks up to 64, exact in int8; bool: and
        product = (np.all(every, axis=0) if dt == "bool"
                   else np.prod(np.stack(every), axis=0).astype(npdt))
        # rank q's Adasum input is (q + 1) v: parallel vectors, whose Adasum at 2 ranks is
        # (1 - 2|v|^2 / 2|v|^2) v + (1 - 2|v|^2 / 8|v|^2) 2v = 1.5 v, exact in every float type
        vector = np.arange(1, 7, dtype=np.float64).reshape(3, 2)
        with_adasum = adasum and dt in FLOATS
        splits = [(me + j) % 2 + 1 for j in range(n)]
        sent = np.arange(sum(splits) * 2).reshape(-1, 2) + 10 * me
        received = []
        for q in range(n):
            their = [(q + j) % 2 + 1 for j in range(n)]
            start = sum(their[:me])
            received.append(np.arange(sum(their) * 2).reshape(-1, 2)[start:start + their[me]]
                            + 10 * q)
        received = np.concatenate(received)
        if dt == "bool":
            sent, received = sent % 2, received % 2
        received = received.astype(npdt)
        rows = 2 * n + 1  # reducescatter: an uneven split
        scatter_in = [_data(q, rows, npdt) for q in range(n)]
        scatter_sum = (np.any(scatter_in, axis=0) if dt == "bool"
                       else np.sum(scatter_in, axis=0).astype(npdt))
        first = me * (rows // n) + min(me, rows % n)
        mine_rows = rows // n + (1 if me < rows % n else 0)
        first3, rows3 = me * (3 // n) + min(me, 3 % n), 3 // n + (1 if me < 3 % n else 0)

        def ops(x, gathered_in, sent_in, scatter_x, parallel):
            return (hvd.allreduce(x, op=op, process_set=ps),
                    hvd.grouped_allreduce([x, x], op=op, process_set=ps),
                    hvd.allgather(gathered_in, process_set=ps),
                    hvd.broadcast(x, root, process_set=ps),
                    hvd.alltoall(sent_in, splits=splits, process_set=ps),
                    hvd.reducescatter(scatter_x, op=hvd.Sum, process_set=ps),
                    hvd.grouped_reducescatter([scatter_x, x], op=hvd.Sum, process_set=ps),
                    hvd.grouped_allgather([gathered_in, x], process_set=ps),
                    hvd.allreduce(x, op=hvd.Product, process_set=ps),
                    hvd.grouped_allreduce([parallel, parallel[:1]], op=hvd.Adasum,
                                          process_set=ps) if with_adasum else [])
        args = (tf.constant(every[me]), tf.constant(_data(me, me + 1, npdt)),
                tf.constant(sent.astype(npdt)), tf.constant(scatter_in[me]),
                tf.constant((vector * (me + 1)).astype(npdt)))
        static = {}

        def traced(*a):
            out = ops(*a)
            static.update(allreduce=out[0].shape.as_list(), allgather=out[2].shape.as_list(),
                          reducescatter=out[5].shape.as_list(),
                          grouped_reducescatter=[g.shape.as_list() for g in out[6]])
            return out
        # autograph=False: its conversion was most of this check's time (the training check
        # still runs the library under autograph)
        for mode, fn in (("eager", ops), ("graph", tf.function(traced, autograph=False))):
            tag = f"{label}.{mode}.{dt}"
            ar, grouped, ag, bc, (a2a, a2a_splits), rs, grs, gag, prod, ada = fn(*args)
            _expect(failures, f"{tag}.allreduce", ar, reduced)
            for k, g in enumerate(grouped):
                _expect(failures, f"{tag}.grouped_allreduce[{k}]", g, reduced)
            _expect(failures, f"{tag}.allgather", ag,
                    np.concatenate([_data(q, q + 1, npdt) for q in range(n)]))
            _expect(failures, f"{tag}.broadcast", bc, every[ps.ranks.index(root)])
            _expect(failures, f"{tag}.alltoall", a2a, received)
            _expect(failures, f"{tag}.alltoall.splits", a2a_splits,
                    np.array([(q + me) % 2 + 1 for q in range(n)], np.int32))
            _expect(failures, f"{tag}.reducescatter", rs,
                    scatter_sum[first:first + mine_rows])
            _expect(failures, f"{tag}.grouped_reducescatter[0]", grs[0],
                    scatter_sum[first:first + mine_rows])
            _expect(failures, f"{tag}.grouped_reducescatter[1]", grs[1],
                    reduced[first3:first3 + rows3])
            _expect(failures, f"{tag}.grouped_allgather[0]", gag[0],
                    np.concatenate([_data(q, q + 1, npdt) for q in range(n)]))
            _expect(failures, f"{tag}.grouped_allgather[1]", gag[1], np.concatenate(every))
            _expect(failures, f"{tag}.product", prod, product)
            if with_adasum:
                _expect(failures, f"{tag}.adasum[0]", ada[0], (vector * 1.5).astype(npdt))
                _expect(failures, f"{tag}.adasum[1]", ada[1], (vector[:1] * 1.5).astype(npdt))
            for result in (ar, ag, bc, a2a, rs, *grs, *gag, prod, *ada):
                if not isinstance(result, tf.Tensor) or result.dtype != tfdt:
                    failures.append(f"{tag}: result {type(result).__name__} {result.dtype}")
        if static != {"allreduce": [3, 2], "allgather": [None, 2],
                      "reducescatter": [mine_rows, 2],
                      "grouped_reducescatter": [[mine_rows, 2], [rows3, 2]]}:
            failures.append(f"{label}.{dt}: static shapes in tf.function {static}")
    # Average of floats, scale factors, Min, Python numbers and NumPy arrays.
    x = tf.constant([1.0, 2.0, 4.0]) * (me + 1)
    mean = np.array([1.0, 2.0, 4.0], np.float32) * (n + 1) / 2
    _expect(failures, f"{label}.average", hvd.allreduce(x, process_set=ps), mean, 1e-6)
    _expect(failures, f"{label}.scaled", hvd.allreduce(x, op=hvd.Sum, prescale_factor=2.0,
                                                        postscale_factor=0.5, process_set=ps),
            mean * n, 1e-6)
    # grouped_reducescatter: mixed dtypes in one group, Average (the default), scale factors
    rows = np.arange(2 * n, dtype=np.float64).reshape(n, 2)
    pair = hvd.grouped_reducescatter([tf.constant(rows * (me + 1)), x[None] * 2.0],
                                     prescale_factor=2.0, postscale_factor=0.5, process_set=ps)
    _expect(failures, f"{label}.grouped_reducescatter.average[0]", pair[0],
            rows[me:me + 1] * (n + 1) / 2, 1e-12)
    _expect(failures, f"{label}.grouped_reducescatter.average[1]", pair[1],
            (mean * 2)[None] if me == 0 else np.zeros((0, 3), np.float32), 1e-6)
    _expect(failures, f"{label}.min", hvd.allreduce(x, op=hvd.Min, process_set=ps),
            np.array([1.0, 2.0, 4.0], np.float32))
    if not adasum:  # before anything is submitted, eagerly and when tracing, as torch's
        for mode, fn in (("eager", hvd.allreduce), ("graph", tf.function(hvd.allreduce)),
                         ("grouped", lambda t, **kw: hvd.grouped_allreduce([t], **kw))):
            try:
                fn(x, op=hvd.Adasum, process_set=ps)
                failures.append(f"{label}.adasum.{mode}: {n} ranks, no error")
            except Exception as exc:  # noqa: BLE001 - the type is what is checked
                if (not isinstance(exc, hvd.AdasumSizeError)
                        or not isinstance(exc, ValueError)
                        or not isinstance(exc, NotImplementedError)
                        or f"the process set has {n} ranks" not in str(exc)):
                    failures.append(f"{label}.adasum.{mode}: {type(exc).__name__}: {exc}")
    _expect(failures, f"{label}.fp16", hvd.allreduce(x, compression=hvd.Compression.fp16,
                                                      process_set=ps), mean, 1e-3)
    if hvd.Compression.fp16.compress(x)[0].dtype != tf.float16:
        failures.append(f"{label}.fp16: not sent as float16")
    _expect(failures, f"{label}.python", hvd.allreduce(2.5, op=hvd.Sum, process_set=ps),
            np.float32(2.5 * n))
    _expect(failures, f"{label}.numpy", hvd.allreduce(np.arange(3), op=hvd.Sum,
                                                       process_set=ps), np.arange(3) * n)
    v = tf.Variable([float(me)] * 2)
    _expect(failures, f"{label}.variable", hvd.allreduce(v, op=hvd.Sum, process_set=ps),
            np.full(2, n * (n - 1) / 2, np.float32))


def check_sparse_and_variables(hvd, tf, np, failures):
    n, me = hvd.size(), hvd.rank()
    slices = tf.IndexedSlices(tf.constant([[1.0, 2.0]]) * (me + 1), tf.constant([me]),
                              dense_shape=tf.constant([n, 2]))
    for mode, fn in (("eager", hvd.allreduce), ("graph", tf.function(hvd.allreduce))):
        out = fn(slices)
        if not isinstance(out, tf.IndexedSlices):
            failures.append(f"sparse.{mode}: got {type(out).__name__}")
            continue
        _expect(failures, f"sparse.{mode}.values", out.values,
                (np.array([[1.0, 2.0]]) * np.arange(1, n + 1)[:, None] / n).astype(np.float32),
                1e-6)
        _expect(failures, f"sparse.{mode}.indices", out.indices, np.arange(n, dtype=np.int32))
        _expect(failures, f"sparse.{mode}.dense", tf.convert_to_tensor(out),
                (np.array([[1.0, 2.0]]) * np.arange(1, n + 1)[:, None] / n).astype(np.float32),
                1e-6)
    scaled = hvd.allreduce(slices, op=hvd.Sum, prescale_factor=0.5, postscale_factor=4.0)
    _expect(failures, "sparse.scaled.values", scaled.values,
            (np.array([[2.0, 4.0]]) * np.arange(1, n + 1)[:, None]).astype(np.float32), 1e-6)
    for factors in ({"prescale_factor": 0.5}, {"postscale_factor": 2.0}):
        try:  # refused on every rank alike (before the allgather: nothing is sent)
            hvd.allreduce(tf.IndexedSlices(tf.constant([[1, 2]]), tf.constant([0]), [n, 2]),
                          **factors)
            failures.append(f"sparse.scaled.int32 {factors}: no error")
        except ValueError as error:
            if "floating-point" not in str(error):
                failures.append(f"sparse.scaled.int32 {factors}: {error}")
    variables = [tf.Variable(np.full((2, 3), me, np.float32)), tf.Variable([me, 7 * me])]
    hvd.broadcast_variables(variables, root_rank=n - 1)
    _expect(failures, "broadcast_variables.eager.0", variables[0],
            np.full((2, 3), n - 1, np.float32))
    _expect(failures, "broadcast_variables.eager.1", variables[1],
            np.array([n - 1, 7 * (n - 1)], np.int32))
    for var in variables:
        var.assign_add(tf.ones_like(var) * me)

    @tf.function
    def broadcast_in_graph():
        hvd.broadcast_variables(variables, root_rank=0)
    broadcast_in_graph()
    _expect(failures, "broadcast_variables.graph", variables[0],
            np.full((2, 3), n - 1, np.float32))
    if hvd.broadcast_object({"from": me}, root_rank=n - 1) != {"from": n - 1}:
        failures.append("broadcast_object")
    if hvd.allgather_object(me * 10) != [q * 10 for q in range(n)]:
        failures.append("allgather_object")


def check_program_order(hvd, tf, np, failures):
    """Two independent unnamed collectives in one tf.function run in program order on every
    rank (their names come from one counter when they run): stateful ops chained by
    tf.function's automatic control dependencies."""
    n = hvd.size()

    @tf.function
    def two(a, b):
        return hvd.allreduce(a, op=hvd.Sum), hvd.allreduce(b, op=hvd.Sum)
    a, b = tf.ones([3]), tf.ones([5, 2])
    for _ in range(5):
        x, y = two(a, b)
        _expect(failures, "order.first", x, np.full(3, n, np.float32))
        _expect(failures, "order.second", y, np.full((5, 2), n, np.float32))
    graph = two.get_concrete_function(a, b).graph
    calls = [op for op in graph.get_operations() if op.type in ("PyFunc", "EagerPyFunc")]
    if len(calls) != 2 or calls[0] not in calls[1].control_inputs:
        failures.append(f"order: {[op.name for op in calls]} not chained by a control "
                        f"dependency ({[c.name for c in calls[-1].control_inputs]})")


def check_barrier_and_join(hvd, tf, np, failures):
    """Eager barrier() and join() behave as engine_native.torch's (tests/multiproc/
    test_barrier_join.py): no rank leaves a barrier before the last one reached it; rank r
    runs r + 1 allreduces then joins, joined ranks contribute zeros (Average still divides by
    the full size), every rank learns that rank n - 1 joined last, and ops work after it."""
    import time
    n, me = hvd.size(), hvd.rank()
    time.sleep(0.05 * me)  # the ranks reach the barrier at different times
    reached = time.time()
    hvd.barrier()
    left = time.time()
    times = hvd.allgather_object((reached, left))
    if max(r for r, _ in times) > min(lft for _, lft in times) + 0.01:
        failures.append(f"barrier: a rank left before the last one reached it: {times}")
    for k in range(me + 1):
        op = hvd.Sum if k % 2 == 0 else hvd.Average
        out = hvd.allreduce(tf.fill([5], float(me + 1)), op=op, name=f"join.{k}")
        total = float(sum(q + 1 for q in range(k, n)))
        _expect(failures, f"join: allreduce {k}", out,
                np.full(5, total if op == hvd.Sum else total / n, np.float32), 1e-6)
    last = hvd.join()
    if last != n - 1:
        failures.append(f"join: returned {last}, want {n - 1}")
    _expect(failures, "after join", hvd.allreduce(tf.constant([me]), op=hvd.Sum),
            np.array([n * (n - 1) // 2], np.int32))
    hvd.barrier()


def check_bad_input(hvd, tf, np, failures):
    """Errors on every rank, and the next op works."""
    n, me = hvd.size(), hvd.rank()
    for bad in ({"a": 1}, None, tf.constant([1], tf.uint32)):
        try:
            hvd.allreduce(bad)
            failures.append(f"bad input {bad!r}: no error")
        except TypeError as exc:
            if "allreduce" not in str(exc):
                failures.append(f"bad input {bad!r}: {exc}")
    mismatches = {"dtypes": (tf.ones([4], tf.float32 if me == 0 else tf.float64), "float"),
                  "shapes": (tf.ones([2 + me]), "shape")}
    for what, (mixed, word) in mismatches.items():
        for mode, fn in (("eager", hvd.allreduce), ("graph", tf.function(hvd.allreduce))):
            try:
                fn(mixed, name=f"mixed_{what}_{mode}")
                failures.append(f"mismatched {what} ({mode}): no error")
            except (ValueError, tf.errors.OpError, hvd.HorovodInternalError) as exc:
                if word not in str(exc):
                    failures.append(f"mismatched {what} ({mode}): {type(exc).__name__}: {exc}")
            _expect(failures, f"after mismatched {what} ({mode})",
                    hvd.allreduce(tf.ones([2]), op=hvd.Sum), np.full(2, n, np.float32))

    # grouped_reducescatter: Sum and Average only, tensors only; an empty list comes back
    for what, call, error, words in (
            ("op=Max", lambda: hvd.grouped_reducescatter([tf.ones([2])], op=hvd.Max),
             ValueError, ("grouped_reducescatter", "hvd.Sum")),
            ("a dict", lambda: hvd.grouped_reducescatter([tf.ones([2]), {"a": 1}]),
             TypeError, ("grouped_reducescatter", "dict"))):
        try:
            call()
            failures.append(f"grouped_reducescatter({what}): no error")
        except error as exc:
            if not all(w in str(exc) for w in words):
                failures.append(f"grouped_reducescatter({what}): {exc}")
    if hvd.grouped_reducescatter([]) != []:
        failures.append("grouped_reducescatter([]): not []")

    unregistered = hvd.ProcessSet([0])
    for mode, fn in (("eager", hvd.allreduce), ("tf.function", tf.function(hvd.allreduce))):
        try:  # refused when called (traced), before any rank submits
            fn(tf.ones([2]), process_set=unregistered)
            failures.append(f"unregistered process set ({mode}): no error")
        except Exception as exc:  # noqa: BLE001 - a graph-time OpError is the failure
            if not isinstance(exc, ValueError) or "not registered" not in str(exc):
                failures.append(f"unregistered process set ({mode}): {exc!r}")

    @tf.function(jit_compile=True)
    def compiled(x):
        return hvd.allreduce(x)
    try:
        compiled(tf.ones([2]))
        failures.append("jit_compile=True: no error")
    except RuntimeError as exc:
        if "jit_compile" not in str(exc):
            failures.append(f"jit_compile=True: {exc}")


def run_all(hvd, tf, np, failures):
    """Every check above, on the global set and (with 3 ranks) on the set [0, 2]."""
    check_collectives(hvd, tf, np, failures, hvd.global_process_set, "global")
    if hvd.size() == 3:
        edges = hvd.add_process_set([0, 2])
        if hvd.rank() in edges.ranks:
            check_collectives(hvd, tf, np, failures, edges, "set[0,2]")
        hvd.remove_process_set(edges)
    check_sparse_and_variables(hvd, tf, np, failures)
    check_program_order(hvd, tf, np, failures)
    check_barrier_and_join(hvd, tf, np, failures)
    check_bad_input(hvd, tf, np, failures)
