"""Rank-side checks of training with engine_native.tensorflow: a custom training loop (small
dense model, SGD, DistributedGradientTape inside a tf.function train step) equals
single-process training on the global batch; the tape's groups, sparse gradients and process
sets.

Every rank also runs the single-process reference itself (no communication), on the
concatenation of all ranks' batches, and compares its distributed result with it. Each check
appends what failed to ``failures``; test_tensorflow_binding.py runs them.
"""
STEPS, BATCH, LR = 20, 8, 0.1


def _model(tf, seed):
    """A 2-layer dense model's variables: 6 -> 16 (tanh) -> 3."""
    init = tf.random.stateless_normal
    return [tf.Variable(init([6, 16], seed=[seed, 1]) * 0.5),
            tf.Variable(init([16], seed=[seed, 2]) * 0.1),
            tf.Variable(init([16, 3], seed=[seed, 3]) * 0.5),
            tf.Variable(init([3], seed=[seed, 4]) * 0.1)]


def _loss(tf, params, x, y):
    w1, b1, w2, b2 = params
    logits = tf.tanh(x @ w1 + b1) @ w2 + b2
    return tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(y, logits))


def _train_step(hvd, tf, params, distributed):
    @tf.function
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = _loss(tf, params, x, y)
        if distributed:
            tape = hvd.DistributedGradientTape(tape)
        for var, grad in zip(params, tape.gradient(loss, params)):
            var.assign_sub(LR * grad)
        return loss
    return step


def _relative_error(np, got, want):
    return max(float(np.max(np.abs(g.numpy() - w.numpy())) / np.max(np.abs(w.numpy())))
               for g, w in zip(got, want))


def check_training(hvd, tf, np, failures):
    n, me = hvd.size(), hvd.rank()
    rng = np.random.default_rng(0)
    x = rng.normal(size=(STEPS * n * BATCH, 6)).astype(np.float32)
    y = rng.integers(0, 3, size=STEPS * n * BATCH).astype(np.int32)
    params = _model(tf, seed=me)  # rank-dependent: broadcast_variables must fix it
    hvd.broadcast_variables(params, root_rank=0)
    reference = _model(tf, seed=0)
    step, reference_step = _train_step(hvd, tf, params, True), _train_step(hvd, tf, reference,
                                                                           False)
    for s in range(STEPS):
        start = s * n * BATCH
        mine = slice(start + me * BATCH, start + (me + 1) * BATCH)
        step(x[mine], y[mine])
        reference_step(x[start:start + n * BATCH], y[start:start + n * BATCH])
    err = _relative_error(np, params, reference)
    if not err <= 1e-5:
        failures.append(f"training (tf.function): relative error {err:.3g} > 1e-5")
    if _relative_error(np, params, _model(tf, seed=0)) < 1e-3:
        failures.append("training: the parameters did not move")
    graph = step.get_concrete_function(x[:BATCH], y[:BATCH]).graph
    calls = [op for op in graph.get_operations() if op.type in ("PyFunc", "EagerPyFunc")]
    if len(calls) != 1:  # the 4 gradients fused into one grouped allreduce
        failures.append(f"training: {len(calls)} collectives per step, want 1")
    for s in range(2):  # eagerly too
        with tf.GradientTape() as tape:
            loss = _loss(tf, params, x[me * BATCH:(me + 1) * BATCH], y[me * BATCH:(me + 1) * BATCH])
        grads = hvd.DistributedGradientTape(tape).gradient(loss, params)
        with tf.GradientTape() as tape:
            loss = _loss(tf, reference, x[:n * BATCH], y[:n * BATCH])
        want = tape.gradient(loss, reference)
        err = _relative_error(np, grads, want)
        if not err <= 1e-5:
            failures.append(f"eager DistributedGradientTape: relative error {err:.3g}")


def check_tape_groups(hvd, tf, np, failures):
    """groups=: the gradients go into the grouped allreduces the rule says (engine_native.
    group_split), counted as the core's fused batches (a group of one is no batch)."""
    import engine_native
    n, me = hvd.size(), hvd.rank()
    a, b, c, d = variables = [tf.Variable(tf.ones([k + 2])) for k in range(4)]
    for label, groups, batches in (("None", None, 1), ("4", 4, 0), ("2", 2, 2),
                                   ("[[d, a]]", [[d, a]], 1),
                                   ("[[a, b], [c, d]]", [[a, b], [c, d]], 2)):
        with tf.GradientTape() as tape:
            loss = tf.add_n([tf.reduce_sum(v) for v in variables]) * (me + 1.0)
        tape = hvd.DistributedGradientTape(tape, op=hvd.Sum, groups=groups)
        before = engine_native.metrics()["fused_batches"]
        grads = tape.gradient(loss, variables)
        fused = engine_native.metrics()["fused_batches"] - before
        if not all(np.allclose(g.numpy(), n * (n + 1) / 2) for g in grads):
            failures.append(f"groups={label}: {[g.numpy() for g in grads]}")
        if fused != batches:
            failures.append(f"groups={label}: {fused} fused batches, want {batches}")


def check_tape_options(hvd, tf, np, failures):
    """Sparse gradients (IndexedSlices, sparse_as_dense), Sum, local sources, process sets."""
    n, me = hvd.size(), hvd.rank()
    table = tf.Variable(tf.zeros([n, 2]))
    dense = tf.Variable(tf.ones([2]))
    # predivide 2: sparse values scaled before and after the allgather (Horovod refuses it)
    for sparse_as_dense, predivide in ((False, 1.0), (True, 1.0), (False, 2.0)):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.gather(table, [me]) * (me + 1.0)) + tf.reduce_sum(dense)
        tape = hvd.DistributedGradientTape(tape, sparse_as_dense=sparse_as_dense,
                                           gradient_predivide_factor=predivide)
        g_table, g_dense = tape.gradient(loss, [table, dense])
        label = f"sparse_as_dense={sparse_as_dense}, predivide={predivide}"
        if isinstance(g_table, tf.IndexedSlices) == sparse_as_dense:
            failures.append(f"{label}: got {type(g_table).__name__}")
        want = np.repeat(np.arange(1, n + 1, dtype=np.float32)[:, None], 2, axis=1) / n
        if not np.allclose(tf.convert_to_tensor(g_table).numpy(), want):
            failures.append(f"{label}: {g_table}")
    with tf.GradientTape() as tape:
        loss = tf.reduce_sum(dense * (me + 1.0)) + tf.reduce_sum(table) * (me + 1.0)
    tape = hvd.DistributedGradientTape(tape, op=hvd.Sum)
    tape.register_local_source(table)
    g_dense, g_table = tape.gradient(loss, [dense, table])
    if not np.allclose(g_dense.numpy(), n * (n + 1) / 2):
        failures.append(f"op=Sum: {g_dense.numpy()}")
    if not np.allclose(g_table.numpy(), (me + 1.0) / n):  # local: not reduced, scaled by 1/n
        failures.append(f"register_local_source: {g_table.numpy()}")
    if n == 3:
        edges = hvd.add_process_set([0, 2])
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(dense * (me + 1.0))
        g, = hvd.DistributedGradientTape(tape, process_set=edges).gradient(loss, [dense])
        want = (1.0 + 3.0) / 2 if me in edges.ranks else me + 1.0  # outside the set: local
        if not np.allclose(g.numpy(), want):
            failures.append(f"process_set [0, 2]: rank {me} got {g.numpy()}, want {want}")
        hvd.remove_process_set(edges)
