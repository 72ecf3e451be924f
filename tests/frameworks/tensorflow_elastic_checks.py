"""Rank-side checks of engine_native.tensorflow.elastic: TensorFlowState's sync, commit and
restore by value, eagerly and through a tf.compat.v1 session; ``hvd.elastic.run`` recovering from a real failure of a collective inside a
``tf.function`` (one rank aborts the core: every rank's step fails with an UnknownError that
carries the core's HorovodInternalError), from the last commit, in the same processes; other
errors pass through; TensorFlowKerasState's sync; bad arguments.

Run last: the recovery re-initializes the core (process sets are gone afterwards). Each check
appends what failed to ``failures``; test_tensorflow_binding.py runs them.
"""
from frameworks.tensorflow_collective_checks import _expect


def check_state(hvd, tf, np, failures):
    me = hvd.rank()
    weights, count = tf.Variable(np.full(3, me, np.float32)), tf.Variable(me * 10)
    state = hvd.elastic.TensorFlowState([weights, count], epoch=me)
    state.sync()
    _expect(failures, "TensorFlowState.sync: rank 0's variable", weights, np.zeros(3, np.float32))
    if int(count.numpy()) != 0 or state.epoch != 0:
        failures.append(f"TensorFlowState.sync: count {count.numpy()}, epoch {state.epoch}")
    weights.assign([1.0, 2.0, 3.0])
    state.epoch = 4
    state.commit()
    weights.assign_add(tf.ones(3))
    count.assign(99)
    state.epoch = 5
    state.restore()
    _expect(failures, "TensorFlowState.restore: the commit", weights,
            np.array([1.0, 2.0, 3.0], np.float32))
    if int(count.numpy()) != 0 or state.epoch != 4:
        failures.append(f"TensorFlowState.restore: count {count.numpy()}, epoch {state.epoch}")
    for args, kwargs, error in (((), {}, ValueError), (([tf.constant(1.0)],), {}, TypeError),
                                (([weights],), {"session": object()}, ValueError)):
        try:
            hvd.elastic.TensorFlowState(*args, **kwargs)
            failures.append(f"TensorFlowState{args}{kwargs}: no error")
        except error as exc:
            if "TensorFlowState" not in str(exc):
                failures.append(f"TensorFlowState{args}{kwargs}: {exc}")


def check_recovery(hvd, tf, np, failures):
    """A failure inside tf.function at epoch 1 on every rank: restored from the commit of
    epoch 1, re-initialized, synchronized, finished without counting a step twice."""
    from engine_native import basics
    n, me = hvd.size(), hvd.rank()
    total = tf.Variable(0.0)
    state = hvd.elastic.TensorFlowState([total], epoch=0)

    @tf.function(autograph=False)  # converting costs seconds; nothing branches on a tensor
    def step(x):
        return hvd.allreduce(x, op=hvd.Sum)
    attempts = []

    @hvd.elastic.run
    def train(state):
        attempts.append(state.epoch)
        while state.epoch < 3:
            if state.epoch == 1 and len(attempts) == 1 and me == n - 1:
                basics.abort(f"simulated failure on rank {me}")
            total.assign_add(step(tf.ones([]))[()])
            state.epoch += 1
            state.commit()
        return state.epoch
    try:
        if train(state) != 3 or attempts != [0, 1]:
            failures.append(f"elastic.run: attempts {attempts}, epoch {state.epoch}")
        _expect(failures, "elastic.run: each step counted once", total, np.float32(3 * n))
    except Exception as exc:  # noqa: BLE001 - any escape is the failure reported
        failures.append(f"elastic.run did not recover: {type(exc).__name__}: {exc}"[:600])
    calls = []

    @hvd.elastic.run
    def wrong(state):
        calls.append(1)
        raise tf.errors.InvalidArgumentError(None, None, "not a collective's error")
    try:
        wrong(state)
        failures.append("elastic.run: another error swallowed")
    except tf.errors.InvalidArgumentError:
        if len(calls) != 1:
            failures.append(f"elastic.run retried another error: {len(calls)} calls")


def check_keras_state(hvd, tf, np, failures):
    import keras
    me = hvd.rank()
    keras.utils.set_random_seed(me)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    state = hvd.elastic.TensorFlowKerasState(model, optimizer=keras.optimizers.SGD(0.1),
                                             backend=None, batch=me)
    state.sync()
    weights = hvd.allgather_object([w.tolist() for w in model.get_weights()])
    if any(w != weights[0] for w in weights) or state.batch != 0:
        failures.append(f"TensorFlowKerasState.sync: weights differ or batch {state.batch}")


def check_session_state(hvd, tf, np, failures):
    """TensorFlowState in a tf.compat.v1 graph through its session, as a TF1 user has it:
    the graph's global variables by default, synchronized from rank 0, committed and restored
    by value, and a sync or restore adds no node to the graph."""
    me = hvd.rank()
    with tf.Graph().as_default() as graph:
        weights = tf.compat.v1.get_variable("w", initializer=np.full(3, me, np.float32))
        count = tf.compat.v1.get_variable("count", initializer=np.int64(me * 10))
        set_weights = weights.assign([1.0, 2.0, 3.0])
        bump = [weights.assign_add(tf.ones(3)), count.assign(99)]
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            state = hvd.elastic.TensorFlowState(session=session, epoch=me)
            state.sync()
            w, c = session.run([weights, count])
            _expect(failures, "TensorFlowState(session).sync", w, np.zeros(3, np.float32))
            if int(c) != 0 or state.epoch != 0:
                failures.append(f"TensorFlowState(session).sync: count {c}, epoch {state.epoch}")
            session.run(set_weights)
            state.epoch = 4
            state.commit()
            session.run(bump)
            state.epoch = 5
            nodes = len(graph.get_operations())
            state.restore()
            w, c = session.run([weights, count])
            _expect(failures, "TensorFlowState(session).restore", w,
                    np.array([1.0, 2.0, 3.0], np.float32))
            if int(c) != 0 or state.epoch != 4:
                failures.append(f"TensorFlowState(session).restore: count {c}, "
                                f"epoch {state.epoch}")
            state.sync()
            if len(graph.get_operations()) != nodes:
                failures.append(f"TensorFlowState(session): the graph grew from {nodes} to "
                                f"{len(graph.get_operations())} nodes in a restore and a sync")


def run_all(hvd, tf, np, failures):
    check_state(hvd, tf, np, failures)
    check_session_state(hvd, tf, np, failures)
    check_keras_state(hvd, tf, np, failures)
    check_recovery(hvd, tf, np, failures)
