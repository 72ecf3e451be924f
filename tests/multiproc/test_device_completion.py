"""How CUDA ops complete, on the fake CUDA runtime and NCCL (issue #39 item 4, issue #38):
a synchronous op whose waiting caller queued it is completed by that caller polling its event,
with no host function (Note [Caller waits on the device] in runtime/device_executor.cc);
async ops keep the host function and complete with nobody waiting; a mix completes in queue
order; abort() ends a caller's wait on an event that never fires. A process set of one rank
exchanges nothing: device copies, scaling by the device kernel (Note [A world of one] in
runtime/device_solo_ops.cc), with no NCCL call.
"""
import threading
import time

import numpy as np
from fakecuda.fixtures import fake_cuda as _fake_cuda

from multiproc import device_ops, faults
from multiproc.harness import run_ranks

fake_cuda = _fake_cuda  # the session fixture, under its name

OPS = 20  # synchronous ops counted per kind once warm
# A waiting caller drives for up to 5 s (not 200 us): its own pass surely queues its op.
LONG_SPIN = {"HVD_CALLER_SPIN_US": "5000000"}
TIMEOUT = 1  # HVD_TIMEOUT of the np=1 launch, which waits it out once


def enqueue_sync(kind, x, out, name, op=None, pre=1.0, post=1.0, set_id=0, stream=0,
                 splits=None):
    """enqueue_for_wait: the op of a synchronous API call, which its wait drives."""
    from engine_native import _core, _dtypes
    code = _dtypes.numpy_code(x.dtype, "enqueue", name)
    return _core.enqueue_for_wait(kind, name, code, x.shape, x, out,
                                  _dtypes.Sum if op is None else op, float(pre), float(post),
                                  0, set_id, splits, 0, stream)


def _sync_allreduce(x, name, **kw):
    from engine_native import _core
    out = np.empty_like(x)
    _core.wait(enqueue_sync(_core.ALLREDUCE, x, out, name, **kw))
    return out


def _core_host_fns(f):
    """cudaLaunchHostFunc calls of the core: the fake NCCL queues each collective it runs as
    one host function too (fake_nccl.c), which is not counted here."""
    return f.calls("cudaLaunchHostFunc") - f.nccl.fakeNcclCollectives()


def _until_done(handles, what):
    from engine_native import _core
    deadline = time.monotonic() + 30
    while not all(_core.poll(h) for h in handles):
        assert time.monotonic() < deadline, f"{what} never completed"
        threading.Event().wait(0.001)  # a bounded poll for the loop thread's work


def completions_on_two_ranks():
    """np=2, NCCL: host functions per synchronous op, async ops nobody waits on, a mix, and
    process sets of one rank."""
    from engine_native import _core
    hvd = device_ops.init()
    f = device_ops.fakes()
    r, n = hvd.rank(), hvd.size()
    _sync_allreduce(np.ones(8, np.float32), "warm")  # communicator made, buffers grown
    device_ops.allgather(np.ones(2, np.float32), "warm.ag")
    launches, driven = _core_host_fns(f), hvd.metrics()["caller_driven_ops"]
    for i in range(OPS):
        got = _sync_allreduce(np.full(16, r + i, np.float32), "sync.ar")
        assert (got == sum(q + i for q in range(n))).all(), got
        y = np.full(3, r + i, np.int32)  # outlives the op
        buffer, shape = _core.wait(enqueue_sync(_core.ALLGATHER, y, None, "sync.ag"))
        got = device_ops.device_array(buffer, shape, np.int32)
        assert (got == np.repeat(np.arange(n) + i, 3)).all(), got
    sync = {"host_fns": _core_host_fns(f) - launches,
            "driven": hvd.metrics()["caller_driven_ops"] - driven}

    # Async ops that nobody waits on complete through the host function's wake.
    launches = _core_host_fns(f)
    xs = [np.full(8, r + k, np.float32) for k in range(3)]
    outs = [np.empty_like(x) for x in xs]
    handles = [device_ops.enqueue(_core.ALLREDUCE, x, o, f"async.{k}")
               for k, (x, o) in enumerate(zip(xs, outs))]
    _until_done(handles, "async allreduces nobody waits on")
    for k, o in enumerate(outs):
        assert (o == sum(q + k for q in range(n))).all(), o
    async_fns = _core_host_fns(f) - launches
    for h in handles:
        _core.wait(h)

    # A mix: async ops, then a synchronous one (float64: never fused with the float32 one);
    # its wait returns with the earlier ones done.
    a_in, g_in = np.full(8, r + 1.0, np.float32), np.full(2, r, np.float32)
    a_out = np.empty_like(a_in)
    a = device_ops.enqueue(_core.ALLREDUCE, a_in, a_out, "mix.a")
    g = device_ops.enqueue(_core.ALLGATHER, g_in, None, "mix.g")
    s = _sync_allreduce(np.full(4, 2.0 * r, np.float64), "mix.s")
    earlier_done = [_core.poll(a), _core.poll(g)]
    buffer, shape = _core.wait(g)
    _core.wait(a)
    mix = (earlier_done, a_out.tolist(), s.tolist(),
           device_ops.device_array(buffer, shape, np.float32).tolist())

    # Process sets of one rank: device copies, no NCCL (scaling: the np=1 test, which pays
    # for compiling the fake's kernels).
    singles = [hvd.add_process_set([q]) for q in range(n)]
    mine = singles[r].process_set_id
    collectives = f.nccl.fakeNcclCollectives()
    x = np.arange(6, dtype=np.float32) + r
    got = _sync_allreduce(x, "single.avg", op=hvd.Average, set_id=mine)
    solo = (got.tolist(), x.tolist(), f.nccl.fakeNcclCollectives() - collectives,
            device_ops.gpu_path(mine))
    return sync, async_fns, mix, solo


def test_sync_ops_skip_the_host_function_async_ops_keep_it(fake_cuda):
    kw = device_ops.rank_envs(fake_cuda, 2, False, extra=LONG_SPIN)
    for r in run_ranks(completions_on_two_ranks, 2, timeout=90, **kw):
        sync, async_fns, mix, solo = r.value
        # A tick of the loop thread may take an op now and then (ci28, loaded: 2 of 40; ci92,
        # loaded: 6 of 40, every op driven); one host function per op would be 2 * OPS.
        assert sync["host_fns"] <= OPS // 2 and sync["driven"] >= 2 * OPS - 2, sync
        assert async_fns >= 1, "async ops completed without a host function's wake"
        earlier_done, a_out, s, gathered = mix
        assert earlier_done == [True, True], "a synchronous op completed before earlier ones"
        assert a_out == [3.0] * 8 and s == [2.0] * 4 and gathered == [0, 0, 1, 1], mix
        got, want, nccl_calls, path = solo
        assert got == want and nccl_calls == 0 and path == "local", solo


def completion_order(path):
    """np=1: async ops behind a late producer, then a synchronous op; a device poll that
    queried an op unfinished would pause before querying the next (HVD_TEST_DEVICE_POLL_GAP_MS:
    the ops behind it finish meanwhile), but the ops behind it on its stream are not queried in
    that poll at all. The timeline file's op ends, in the order they were recorded: completion
    order, whichever thread polled."""
    from engine_native import _core
    from multiproc.test_timeline import _load
    hvd = device_ops.init()
    f = device_ops.fakes()
    producer = f.stream()
    _sync_allreduce(np.ones(4, np.float32), "warm", stream=producer)  # the set is set up
    hvd.start_timeline(path)
    ins = [np.zeros(4, np.float32), np.zeros(4, np.float32), np.zeros(4, np.float64)]
    outs = [np.empty_like(a) for a in ins]
    f.check(f.cuda.fakeCudaLaunchDelayedFill(ins[0].ctypes.data, 0x40, 16, 100, producer))
    handles = [device_ops.enqueue(_core.ALLREDUCE, a, o, f"order.{k}", stream=producer)
               for k, (a, o) in enumerate(zip(ins[:2], outs[:2]))]
    _core.wait(enqueue_sync(_core.ALLREDUCE, ins[2], outs[2], "order.sync", stream=producer))
    for h in handles:
        _core.wait(h)
    hvd.stop_timeline()
    events = _load(path)
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name"}
    # a tensor's last E is its op's completion; the file keeps the order of the records
    last_end = {names.get(e["pid"]): i for i, e in enumerate(events) if e.get("ph") == "E"}
    order = [last_end.get(n) for n in ("order.0", "order.1", "order.sync")]
    return order, outs[0].view(np.uint8).tolist()


def test_ops_complete_in_queue_order_though_later_ones_finish_while_polled(fake_cuda, tmp_path):
    kw = device_ops.rank_envs(fake_cuda, 1, False, extra={"HVD_TEST_DEVICE_POLL_GAP_MS": "300"})
    ends, out = run_ranks(completion_order, 1, args=(str(tmp_path / "timeline.json"),),
                          timeout=60, **kw)[0].value
    assert None not in ends and ends == sorted(ends), f"completed out of queue order: {ends}"
    assert out == [0x40] * 16, out


def world_of_one():
    """np=1: every collective and reduce op on the device, no NCCL; ops whose producers run
    late are seen finished by their polling caller; abort() ends a wait on a stuck event."""
    from engine_native import _core
    hvd = device_ops.init()
    f = device_ops.fakes()
    before = {"nccl": f.nccl.fakeNcclCollectives(), "pinned": f.calls("cudaMallocHost")}
    x = np.array([1.5, -2.0, 3.25, 0.5], np.float32)
    got = {}
    for name, op in [("sum", hvd.Sum), ("average", hvd.Average), ("min", hvd.Min),
                     ("max", hvd.Max), ("product", hvd.Product)]:
        got[name] = _sync_allreduce(x, name, op=op).tolist()
        got[name + ".scaled"] = _sync_allreduce(x, name + ".s", op=op, pre=2.0,
                                                post=0.25).tolist()
    in_place = x.copy()
    _core.wait(enqueue_sync(_core.ALLREDUCE, in_place, in_place, "in.place", pre=3.0))
    got["in_place"] = in_place.tolist()
    got["int"] = _sync_allreduce(np.arange(5, dtype=np.int32), "int").tolist()
    got["allgather"] = device_ops.allgather(x.reshape(2, 2), "ag").tolist()
    got["broadcast"] = device_ops.broadcast(x, 0, "bc").tolist()
    got["alltoall"] = [a.tolist() if hasattr(a, "tolist") else a
                       for a in device_ops.alltoall(x, [4], "a2a")]
    got["reducescatter"] = device_ops.reducescatter(x, hvd.Average, "rs", post=0.5).tolist()
    exchanged = {"nccl": f.nccl.fakeNcclCollectives() - before["nccl"],
                 "pinned": f.calls("cudaMallocHost") - before["pinned"],
                 "path": device_ops.gpu_path()}

    # Producers that finish 20 ms later: the op outlasts the caller's spin, so it waits on
    # the event itself (no host function), and reads what the producer wrote.
    producer = f.stream()
    polled, launches = hvd.metrics()["caller_polled_ops"], f.calls("cudaLaunchHostFunc")
    late = []
    for i in range(3):
        y = np.zeros(4, np.float32)
        f.check(f.cuda.fakeCudaLaunchDelayedFill(y.ctypes.data, 0x40 + i, y.nbytes, 20,
                                                 producer))
        late.append(_sync_allreduce(y, f"late.{i}", stream=producer).view(np.uint32).tolist())
    late_counts = (hvd.metrics()["caller_polled_ops"] - polled,
                   f.calls("cudaLaunchHostFunc") - launches)

    # Async ops behind a late producer, then a synchronous one (float64: not fused with them):
    # its caller's polls complete them all, in queue order; then a wait that comes after its
    # op's host function was queued.
    polled, launches = hvd.metrics()["caller_polled_ops"], f.calls("cudaLaunchHostFunc")
    ins = [np.zeros(4, np.float32), np.zeros(4, np.float32), np.zeros(4, np.float64)]
    outs = [np.empty_like(a) for a in ins]
    for k, a in enumerate(ins):
        f.check(f.cuda.fakeCudaLaunchDelayedFill(a.ctypes.data, 0x40, a.nbytes, 10, producer))
    handles = [device_ops.enqueue(_core.ALLREDUCE, a, o, f"queued.{k}", stream=producer)
               for k, (a, o) in enumerate(zip(ins[:2], outs[:2]))]
    _core.wait(enqueue_sync(_core.ALLREDUCE, ins[2], outs[2], "queued.sync", stream=producer))
    queued = [bool(_core.poll(h)) for h in handles]
    for h in handles:
        _core.wait(h)
    f.check(f.cuda.fakeCudaLaunchDelayedFill(ins[0].ctypes.data, 0x41, 16, 20, producer))
    _core.wait(device_ops.enqueue(_core.ALLREDUCE, ins[0], outs[0], "waited.later",
                                  stream=producer))
    queued_counts = (queued, [o.view(np.uint8).tolist() for o in outs],
                     hvd.metrics()["caller_polled_ops"] - polled,
                     f.calls("cudaLaunchHostFunc") - launches)

    # The caller waits on an event behind a producer that never finishes: abort() ends the
    # wait; HVD_TIMEOUT does (the core fails, by the caller's poll or the loop's tick).
    aborted = _wait_behind_a_stuck_producer(hvd, f, producer, abort=True)
    hvd.shutdown()
    hvd.init()
    timed_out = _wait_behind_a_stuck_producer(hvd, f, producer, abort=False)
    return got, exchanged, late, late_counts, queued_counts, aborted, timed_out


def _wait_behind_a_stuck_producer(hvd, f, producer, abort):
    """(error, seconds) of a synchronous allreduce's wait whose input's producer is stuck
    (the fake's blocker, released after the wait), with abort() once the caller waits."""
    from engine_native import _core
    token = f.cuda.fakeCudaLaunchBlocker(producer)
    stuck = np.ones(4, np.float32)
    out = np.empty_like(stuck)  # both outlive the op
    handle = enqueue_sync(_core.ALLREDUCE, stuck, out, "stuck", stream=producer)

    def abort_once_blocked():
        deadline = time.monotonic() + 30
        while hvd.metrics()["main_blocked_seconds"] == 0 and time.monotonic() < deadline:
            threading.Event().wait(0.001)  # until the main thread sits in wait()
        hvd.abort("test")
    aborter = threading.Thread(target=abort_once_blocked)
    if abort:
        aborter.start()
    error, seconds = faults.timed_wait(handle)
    if abort:
        aborter.join()
    f.check(f.cuda.fakeCudaReleaseBlocker(token))
    f.check(f.cuda.cudaStreamSynchronize(producer))  # the op's stream work ends before `out`
    return error, seconds


def test_a_world_of_one_exchanges_nothing_and_waits_on_events(fake_cuda):
    kw = device_ops.rank_envs(fake_cuda, 1, False, extra={"HVD_TIMEOUT": str(TIMEOUT)})
    got, exchanged, late, late_counts, queued_counts, aborted, timed_out = run_ranks(
        world_of_one, 1, timeout=60, **kw)[0].value
    x = np.array([1.5, -2.0, 3.25, 0.5], np.float32)
    scaled = ((x * np.float32(2.0)) * np.float32(0.25)).tolist()
    for name in ("sum", "average", "min", "max", "product"):
        assert got[name] == x.tolist() and got[name + ".scaled"] == scaled, (name, got)
    assert got["in_place"] == (x * np.float32(3.0)).tolist(), got
    assert got["int"] == list(range(5)), got
    assert got["allgather"] == x.reshape(2, 2).tolist() and got["broadcast"] == x.tolist()
    assert got["alltoall"] == [x.tolist(), [4]], got
    assert got["reducescatter"] == (x * np.float32(0.5)).tolist(), got
    assert exchanged == {"nccl": 0, "pinned": 0, "path": "local"}, exchanged
    assert late == [[int.from_bytes(bytes([0x40 + i]) * 4, "little")] * 4 for i in range(3)]
    polled, host_fns = late_counts
    assert polled >= 1 and host_fns <= 1, late_counts
    queued, outs, polled, host_fns = queued_counts
    assert queued == [True, True], "a synchronous op completed before earlier ones"
    assert outs == [[0x41] * 16, [0x40] * 16, [0x40] * 32], outs
    # the async ops' host functions (2 or 3) and the late waiter's; not the synchronous op's
    assert polled <= 1 and 2 <= host_fns <= 4, queued_counts
    error, seconds = aborted
    assert error and "aborted" in error and seconds < TIMEOUT, aborted
    error, seconds = timed_out
    assert error and "made no progress" in error and seconds < TIMEOUT + 3, timed_out
