"""Rank-side checks of the gradients through engine_native.tensorflow's collectives (Horovod
0.28's registered gradients), by value against their closed forms on every rank: each op with
a rank-dependent upstream gradient, eagerly, with the tape inside a tf.function, and with the
tape outside a tf.function (whose backward function TF builds without control dependencies:
its collectives must still run in the same order on every rank).

Each check appends what failed to ``failures``; test_tensorflow_binding.py runs them.
"""
from frameworks.tensorflow_collective_checks import _expect


def _modes(tf):
    """(label, run) pairs: ``run(fn, xs, upstream)`` is d(sum(upstream * fn(*xs)))/d(xs)."""
    def gradient(fn, xs, upstream):
        with tf.GradientTape() as tape:
            tape.watch(xs)
            ys = fn(*xs)
        return tape.gradient(ys, xs, output_gradients=upstream)

    def outside(fn, xs, upstream):
        traced = tf.function(fn, autograph=False)
        with tf.GradientTape() as tape:
            tape.watch(xs)
            ys = traced(*xs)
        return tape.gradient(ys, xs, output_gradients=upstream)
    # autograph=False: nothing here branches on a tensor, and converting costs seconds
    return (("eager", gradient), ("tf.function", tf.function(gradient, autograph=False)),
            ("outside tf.function", outside))


def _cases(hvd, tf, np, ps):
    """(name, fn, inputs, upstream, expected input gradients) for rank ``ps.rank()``."""
    n, me = ps.size(), ps.rank()
    w = float(me + 1)  # this rank's upstream weight; the mean over the set is (n + 1) / 2
    mean, total = (n + 1) / 2, n * (n + 1) / 2
    x = tf.constant(np.arange(6, dtype=np.float32).reshape(3, 2) * w)
    x64 = tf.constant(np.arange(4, dtype=np.float64) - me)
    ones, ones64 = np.ones((3, 2), np.float32), np.ones(4)
    cases = [
        ("allreduce.sum", lambda a: hvd.allreduce(a, op=hvd.Sum, process_set=ps),
         [x], [w * ones], [total * ones]),
        ("allreduce.average.scaled",
         lambda a: hvd.allreduce(a, prescale_factor=2.0, postscale_factor=1.5,
                                 process_set=ps), [x64], [w * ones64], [3 * mean * ones64]),
        ("allreduce.fp16", lambda a: hvd.allreduce(a, compression=hvd.Compression.fp16,
                                                   process_set=ps), [x], [w * ones],
         [mean * ones]),
        ("grouped_allreduce", lambda a, b: hvd.grouped_allreduce([a, b], op=hvd.Sum,
                                                                 process_set=ps),
         [x, x64], [w * ones, 2 * w * ones64], [total * ones, 2 * total * ones64]),
    ]
    # allgather: rank q gives q + 1 rows; rank q's upstream is (q + 1) * arange over all rows.
    rows = n * (n + 1) // 2
    first = me * (me + 1) // 2
    gathered = np.arange(rows * 2, dtype=np.float32).reshape(rows, 2)
    mine = tf.ones([me + 1, 2])
    cases.append(("allgather", lambda a: hvd.allgather(a, process_set=ps), [mine],
                  [w * gathered], [mean * gathered[first:first + me + 1]]))
    ints = tf.constant([me] * (me + 1))
    cases.append(("grouped_allgather",  # mixed dtypes, and an integer tensor without gradient
                  lambda a, b, i: hvd.grouped_allgather([a, b, i], process_set=ps),
                  [mine, tf.cast(mine, tf.float64), ints],
                  [w * gathered, -w * gathered.astype(np.float64), None],
                  [mean * gathered[first:first + me + 1],
                   -mean * gathered[first:first + me + 1].astype(np.float64), None]))
    cases.append(("allreduce.IndexedSlices",  # Horovod: an allgather of the values, / n
                  lambda v: hvd.allreduce(tf.IndexedSlices(v, tf.range(me + 1), [rows, 2]),
                                          process_set=ps).values,
                  [mine], [w * gathered], [mean / n * gathered[first:first + me + 1]]))
    root = ps.ranks[-1]
    cases.append(("broadcast", lambda a: hvd.broadcast(a, root, process_set=ps), [x],
                  [w * ones], [(mean if hvd.rank() == root else 0.0) * ones]))
    # alltoall: rank q sends (q + j) % 2 + 1 rows to rank j and scales what it receives by
    # (q + 1): the rows this rank sent to j come back times (j + 1).
    splits = [(me + j) % 2 + 1 for j in range(n)]
    sent = np.arange(sum(splits) * 2, dtype=np.float32).reshape(-1, 2) + 10 * me
    back = np.concatenate([np.full((s, 2), j + 1.0, np.float32) for j, s in enumerate(splits)])
    received_rows = sum((q + me) % 2 + 1 for q in range(n))
    cases.append(("alltoall", lambda a: hvd.alltoall(a, splits=splits, process_set=ps)[0],
                  [tf.constant(sent)], [np.full((received_rows, 2), w, np.float32)],
                  [back]))
    # reducescatter of 2n + 1 rows (uneven): rank q's upstream is q + 1 on its rows.
    scatter = np.arange((2 * n + 1) * 2, dtype=np.float32).reshape(-1, 2)
    counts = [2 + (1 if q < 1 else 0) for q in range(n)]
    every = np.concatenate([np.full((c, 2), q + 1.0, np.float32) for q, c in enumerate(counts)])
    upstream = np.full((counts[me], 2), w, np.float32)
    cases.append(("reducescatter.sum", lambda a: hvd.reducescatter(a, op=hvd.Sum,
                                                                    process_set=ps),
                  [tf.constant(scatter)], [upstream], [n * every]))  # Horovod: times size
    cases.append(("reducescatter.average.prescaled",
                  lambda a: hvd.reducescatter(a, prescale_factor=3.0, process_set=ps),
                  [tf.constant(scatter)], [upstream], [3.0 * every]))
    cases.append(("grouped_reducescatter",  # mixed dtypes and an integer without gradient
                  lambda a, b, i: hvd.grouped_reducescatter(
                      [a, b, i], op=hvd.Sum, postscale_factor=0.5, process_set=ps),
                  [tf.constant(scatter), tf.constant(scatter, tf.float64),
                   tf.constant(scatter, tf.int32)],
                  [upstream, 2 * upstream.astype(np.float64), None],
                  [0.5 * n * every, n * every.astype(np.float64), None]))
    return cases


def check_gradients(hvd, tf, np, failures, ps, label):
    """Every collective's gradient on ``ps`` against its closed form, in each mode: all cases
    in one function (one trace per mode: tracing is what costs here)."""
    cases = _cases(hvd, tf, np, ps)
    # Integer inputs (and their None upstream) stay out of the differentiated lists.
    xs = [tf.identity(x) for _, _, ins, _, _ in cases for x in ins  # distinct: one gradient
          if x.dtype.is_floating]                                      # each
    upstream = [tf.constant(u) for _, _, _, ups, _ in cases for u in ups if u is not None]

    def every_case(*floats):
        floats, outputs = list(floats), []
        for _, fn, ins, ups, _ in cases:
            args = [floats.pop(0) if x.dtype.is_floating else x for x in ins]
            ys = fn(*args)
            ys = ys if isinstance(ys, list) else [ys]
            outputs += [y for y, u in zip(ys, ups) if u is not None]
        return outputs
    for mode, run in _modes(tf):
        grads = list(run(every_case, xs, upstream))
        for name, _, ins, _, want in cases:
            for k, (x, e) in enumerate(zip(ins, want)):
                if x.dtype.is_floating:
                    _expect(failures, f"{label}.grad.{mode}.{name}[{k}]", grads.pop(0),
                            np.asarray(e, dtype=x.dtype.as_numpy_dtype), 1e-6)


def check_backward_order(hvd, tf, np, failures):
    """Six collectives of different shapes in one tf.function, differentiated by a tape
    outside it, three times: their gradients' collectives run in one order on every rank."""
    n, me = hvd.size(), hvd.rank()

    @tf.function(autograph=False)
    def many(*xs):
        return [hvd.allreduce(x, op=hvd.Sum) for x in xs]
    xs = [tf.fill([k + 1], float(me + 1)) for k in range(6)]
    for attempt in range(3):
        with tf.GradientTape() as tape:
            tape.watch(xs)
            ys = many(*xs)
            loss = tf.add_n([tf.reduce_sum(y) * float(me + 1) for y in ys])
        grads = tape.gradient(loss, xs)
        for k, g in enumerate(grads):
            _expect(failures, f"backward order[{attempt}][{k}]", g,
                    np.full(k + 1, n * (n + 1) / 2, np.float32))


def check_gradient_errors(hvd, tf, np, failures):
    """Integer inputs have no gradient (None, as for any TF op), and the op still works."""
    n = hvd.size()
    x = tf.constant([1, 2, 3])
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = hvd.allreduce(x, op=hvd.Sum)
    if tape.gradient(y, x) is not None:
        failures.append("integer allreduce: a gradient")
    _expect(failures, "integer allreduce under a tape", y, np.array([1, 2, 3], np.int32) * n)


def run_all(hvd, tf, np, failures):
    check_gradients(hvd, tf, np, failures, hvd.global_process_set, "global")
    if hvd.size() == 3:
        edges = hvd.add_process_set([0, 2])
        if hvd.rank() in edges.ranks:
            check_gradients(hvd, tf, np, failures, edges, "set[0,2]")
        hvd.remove_process_set(edges)
    check_backward_order(hvd, tf, np, failures)
    check_gradient_errors(hvd, tf, np, failures)
