"""Rank-side checks of engine_native.tensorflow's TF1 API, as a tf.compat.v1 user writes it:
collectives in a tf.compat.v1 graph run by a Session (several independent ones in one
``session.run``, run twice: their names come from the graph, Note [TF1 graphs]), a gradient
through one by ``tf.compat.v1.gradients`` (two of one shape, fetched in either order: the
backward collectives are named from the graph too); one explicit name built twice;
DistributedOptimizer wrapping a ``tf.compat.v1.train`` optimizer under a MonitoredSession
with BroadcastGlobalVariablesHook (rank-dependent initial values) equals single-process
training on the global batch, also with groups, and eagerly; with 8 groups in a Session of 2
inter-op threads (it would hang unless the groups run in order); register_local_var;
broadcast_global_variables;
the refusals.

Each check appends what failed to ``failures``; test_tensorflow_binding.py runs them.
"""
from frameworks.tensorflow_collective_checks import _expect


def check_graph_collectives(hvd, tf, np, failures):
    n, me = hvd.size(), hvd.rank()
    base = np.arange(6, dtype=np.float32).reshape(3, 2)
    total = n * (n + 1) / 2
    first3, rows3 = me * (3 // n) + min(me, 3 % n), 3 // n + (1 if me < 3 % n else 0)
    want = {
        "allreduce": base * total,
        "allreduce.int": np.full(4, n * (n - 1) // 2, np.int32),
        "grouped": [base * total, np.full(4, n * (n - 1) // 2, np.int32)],
        "allgather": np.concatenate([np.full((q + 1, 2), q, np.float32) for q in range(n)]),
        "broadcast": base * n,
        "alltoall": np.array([2 * me + 10 * q + k for q in range(n) for k in (0, 1)], np.int32),
        "grouped_reducescatter": [(base * total)[first3:first3 + rows3],
                                  (base * total)[first3:first3 + rows3].astype(np.float64)],
        "grad": np.full((3, 2), total, np.float32),
    }
    with tf.Graph().as_default():
        x = tf.constant(base * (me + 1))
        ints = tf.fill([4], me)
        outs = {
            "allreduce": hvd.allreduce(x, op=hvd.Sum),
            "allreduce.int": hvd.allreduce(ints, op=hvd.Sum),
            "grouped": hvd.grouped_allreduce([x, ints], op=hvd.Sum),
            "allgather": hvd.allgather(tf.fill([me + 1, 2], float(me))),
            "broadcast": hvd.broadcast(x, root_rank=n - 1),
            "alltoall": hvd.alltoall(tf.range(2 * n) + 10 * me),
            "grouped_reducescatter": hvd.grouped_reducescatter([x, tf.cast(x, tf.float64)],
                                                               op=hvd.Sum),
            "grad": tf.compat.v1.gradients(hvd.allreduce(x, op=hvd.Sum) * float(me + 1), x)[0],
        }
        with tf.compat.v1.Session() as session:
            for attempt in range(2):
                got = session.run(outs)
                for key, value in want.items():
                    for k, (g, w) in enumerate(zip(*(
                            (got[key], value) if isinstance(value, list)
                            else ([got[key]], [value])))):
                        _expect(failures, f"v1.{key}[{k}].run{attempt}", g, w, 1e-6)


def _fetch_crossed(session, me, a, b):
    """(a, b): rank 0 fetches both in one ``session.run`` (the executor picks their order),
    the others b, then a."""
    if me == 0:
        return session.run([a, b])
    got_b = session.run(b)
    return session.run(a), got_b


def check_names_from_the_graph(hvd, tf, np, failures):
    """Two unnamed allreduces of different shapes: rank 0 runs both in one ``session.run``
    (the executor picks their order, two threads), the others run B, then A. Each is matched
    by the name it took from the graph, so the values are right however they interleave."""
    n, me = hvd.size(), hvd.rank()
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
    with tf.Graph().as_default():
        a = hvd.allreduce(tf.fill([2], float(me)), op=hvd.Sum)
        b = hvd.allreduce(tf.fill([3, 1], float(me + 1)), op=hvd.Sum)
        with tf.compat.v1.Session(config=config) as session:
            for attempt in range(3):
                got_a, got_b = _fetch_crossed(session, me, a, b)
                _expect(failures, f"v1.names.a.run{attempt}", got_a,
                        np.full(2, n * (n - 1) / 2, np.float32))
                _expect(failures, f"v1.names.b.run{attempt}", got_b,
                        np.full((3, 1), n * (n + 1) / 2, np.float32))


def check_explicit_names(hvd, tf, np, failures):
    """One named allreduce built twice in one graph (a tower), both fetched in one
    ``session.run``: the name is made unique in the graph as a node's (Horovod's are node
    names), so they are two ops, not one name twice in flight. With ``ignore_name_scope``
    under two name scopes as well (made unique outside any scope)."""
    n, me = hvd.size(), hvd.rank()
    total = n * (n + 1) / 2
    with tf.Graph().as_default():
        def tower(v, scope, **kwargs):
            with tf.name_scope(scope):
                return hvd.allreduce(tf.fill([4], v * (me + 1)), op=hvd.Sum, name="loss",
                                     **kwargs)
        outs = [tower(1.0, "t"), tower(100.0, "t"),
                tower(2.0, "a", ignore_name_scope=True), tower(3.0, "b", ignore_name_scope=True)]
        with tf.compat.v1.Session() as session:
            for attempt in range(2):
                got = session.run(outs)
                for k, (g, v) in enumerate(zip(got, (1.0, 100.0, 2.0, 3.0))):
                    _expect(failures, f"v1.explicit_names[{k}].run{attempt}", g,
                            np.full(4, v * total, np.float32))


def check_backward_names(hvd, tf, np, failures):
    """The gradients of two unnamed allreduces of the same shape (backward collectives of one
    shape: swapped, the core could not tell). Rank 0 fetches both in one ``session.run`` (the
    executor picks their order), the others B, then A. The backward collectives take their
    names from the graph too, so each gradient is its own on every step."""
    n, me = hvd.size(), hvd.rank()
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
    with tf.Graph().as_default():
        xa, xb = tf.fill([4], float(me + 1)), tf.fill([4], float(me + 1))
        ga = tf.compat.v1.gradients(hvd.allreduce(xa, op=hvd.Sum) * 1.0, xa)[0]
        gb = tf.compat.v1.gradients(hvd.allreduce(xb, op=hvd.Sum) * 100.0, xb)[0]
        with tf.compat.v1.Session(config=config) as session:
            for step in range(40):
                got_a, got_b = _fetch_crossed(session, me, ga, gb)
                _expect(failures, f"v1.backward_names.a.step{step}", got_a,
                        np.full(4, n, np.float32))
                _expect(failures, f"v1.backward_names.b.step{step}", got_b,
                        np.full(4, 100 * n, np.float32))


def _train(hvd, tf, np, x, y, w0, distributed, steps=5, **optimizer_kwargs):
    """``steps`` of SGD on a linear model in a TF1 graph; the final variables."""
    with tf.Graph().as_default():
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(w0))
        b = tf.compat.v1.get_variable("b", initializer=tf.constant(w0[:1, 0] * 0.5))
        loss = tf.reduce_mean((tf.matmul(tf.constant(x), w) + b - tf.constant(y)) ** 2)
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        hooks = []
        if distributed:
            optimizer = hvd.DistributedOptimizer(optimizer, **optimizer_kwargs)
            hooks = [hvd.BroadcastGlobalVariablesHook(0)]
        train = optimizer.minimize(loss)
        with tf.compat.v1.train.MonitoredSession(
                session_creator=tf.compat.v1.train.ChiefSessionCreator(),
                hooks=hooks) as session:
            for _ in range(steps):
                session.run(train)
            return session.run([w, b])


def check_distributed_optimizer(hvd, tf, np, failures):
    n, me = hvd.size(), hvd.rank()
    rng = np.random.default_rng(3)
    x = rng.standard_normal((4 * n, 3)).astype(np.float32)
    y = (x @ np.array([[1.0], [-2.0], [0.5]], np.float32) + 0.3).astype(np.float32)
    w0 = np.array([[0.1], [0.2], [0.3]], np.float32)
    reference = _train(hvd, tf, np, x, y, w0, False)
    mine = slice(4 * me, 4 * me + 4)
    for label, kwargs in (("one group", {}), ("groups=2", {"groups": 2})):
        got = _train(hvd, tf, np, x[mine], y[mine], w0 + me, True, **kwargs)
        for k, (g, r) in enumerate(zip(got, reference)):
            _expect(failures, f"v1.DistributedOptimizer.{label}[{k}]", g, r, 1e-5)
        if np.allclose(got[0], w0, atol=1e-3):
            failures.append(f"v1.DistributedOptimizer.{label}: the weights did not move")
    # eagerly (TF2), as Horovod's wrapper also runs: minimize(callable loss)
    w = tf.Variable(w0 + me)
    hvd.broadcast_variables([w], root_rank=0)
    opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1))
    for _ in range(5):
        opt.minimize(lambda: tf.reduce_mean((x[mine] @ w - y[mine]) ** 2),
                     var_list=[w])
    alone = tf.Variable(w0)
    plain = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    for _ in range(5):
        plain.minimize(lambda: tf.reduce_mean((x @ alone - y) ** 2), var_list=[alone])
    _expect(failures, "v1.DistributedOptimizer.eager", w, alone.numpy(), 1e-5)


def check_local_var(hvd, tf, np, failures):
    """register_local_var: that variable's gradient stays this rank's (divided by the set
    size, scale_local_gradients), the other one is summed; in a graph, as a TF1 user runs it."""
    n, me = hvd.size(), hvd.rank()
    for scale in (True, False):
        with tf.Graph().as_default():
            shared = tf.compat.v1.get_variable("shared", initializer=np.ones(2, np.float32))
            mine = tf.compat.v1.get_variable("mine", initializer=np.ones(2, np.float32))
            opt = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(1.0),
                                           op=hvd.Sum, scale_local_gradients=scale)
            opt.register_local_var(mine)
            loss = tf.reduce_sum(shared + mine) * (me + 1.0)
            pairs = opt.compute_gradients(loss, var_list=[shared, mine])
            with tf.compat.v1.Session() as session:
                session.run(tf.compat.v1.global_variables_initializer())
                g_shared, g_mine = session.run([g for g, _ in pairs])
        _expect(failures, f"v1.register_local_var.shared.scale={scale}", g_shared,
                np.full(2, n * (n + 1) / 2, np.float32), 1e-6)
        _expect(failures, f"v1.register_local_var.mine.scale={scale}", g_mine,
                np.full(2, (me + 1.0) / (n if scale else 1), np.float32), 1e-6)


def check_groups_in_few_threads(hvd, tf, np, failures):
    """DistributedOptimizer(groups=8) in a Session of 2 inter-op threads. Each group's
    collective blocks an executor thread while it waits: unless the groups run one after the
    other, ranks fill their two threads with different groups and hang (Note [TF1 graphs]).
    The loss is rank-dependent, sum_i (i+1)(me+1)|w_i|^2, so the averaged gradient steps
    every w_i by the factor 1 - 2 lr (i+1)(n+1)/2 (single-process training on the mean)."""
    n, me, lr, k, steps = hvd.size(), hvd.rank(), 0.002, 8, 20
    with tf.Graph().as_default():
        ws = [tf.compat.v1.get_variable(f"w{i}", initializer=tf.fill([3], float(me + 1)))
              for i in range(k)]
        loss = tf.add_n([tf.reduce_sum(w * w) * float((i + 1) * (me + 1))
                         for i, w in enumerate(ws)])
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(lr)
        train = hvd.DistributedOptimizer(optimizer, groups=k).minimize(loss)
        bcast = hvd.broadcast_global_variables(0)
        config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=2)
        with tf.compat.v1.Session(config=config) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(bcast)
            for _ in range(steps):
                session.run(train)
            got = session.run(ws)
    for i, g in enumerate(got):
        factor = (1 - 2 * lr * (i + 1) * (n + 1) / 2) ** steps
        _expect(failures, f"v1.groups=8 in 2 threads.w{i}", g,
                np.full(3, factor, np.float32), 1e-5)


def check_refusals(hvd, tf, np, failures):
    with tf.Graph().as_default():  # no variables: an op that does nothing, as tf.group()
        nothing = hvd.broadcast_global_variables(0)
        with tf.compat.v1.Session() as session:
            session.run(nothing)
    with tf.Graph().as_default():  # act when called: in a graph, refused (not run once)
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([2]))
        bogus = hvd.DistributedOptimizer(tf.compat.v1.train.GradientDescentOptimizer(0.1),
                                         op="bogus")
        for what, call, word in (
                ("barrier in a graph", hvd.barrier, "eagerly"),
                ("join in a graph", hvd.join, "eagerly"),
                ("op='bogus'", lambda: bogus.minimize(tf.reduce_sum(w)),
                 "DistributedOptimizer.compute_gradients")):
            try:
                call()
                failures.append(f"v1 {what}: no error")
            except (RuntimeError, ValueError) as exc:
                if word not in str(exc):
                    failures.append(f"v1 {what}: {exc}")
    sgd = tf.compat.v1.train.GradientDescentOptimizer(0.1)
    for what, call, error, word in (
            ("broadcast_global_variables eagerly", lambda: hvd.broadcast_global_variables(0),
             RuntimeError, "broadcast_variables"),
            ("backward_passes_per_step=2", lambda: hvd.DistributedOptimizer(
                sgd, backward_passes_per_step=2), ValueError, "backward_passes_per_step"),
            ("op=Adasum", lambda: hvd.DistributedOptimizer(sgd, op=hvd.Adasum), ValueError,
             "Adasum"),
            ("not an optimizer", lambda: hvd.DistributedOptimizer(object()), ValueError,
             "pass a tf.compat.v1.train.Optimizer or a keras.optimizers.Optimizer")):
        try:
            call()
            failures.append(f"v1 {what}: no error")
        except error as exc:
            if word not in str(exc):
                failures.append(f"v1 {what}: {exc}")


def run_all(hvd, tf, np, failures):
    check_graph_collectives(hvd, tf, np, failures)
    check_names_from_the_graph(hvd, tf, np, failures)
    check_backward_names(hvd, tf, np, failures)
    check_explicit_names(hvd, tf, np, failures)
    check_distributed_optimizer(hvd, tf, np, failures)
    check_local_var(hvd, tf, np, failures)
    check_groups_in_few_threads(hvd, tf, np, failures)
    check_refusals(hvd, tf, np, failures)
