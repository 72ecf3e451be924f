"""Grouped allgathers fused into one core op (Note [Allgather fusion] in coord/fusion.cc, Note
[Fused allgather] in runtime/cpu_executor.cc), on spawned ranks, checked against NumPy.

Covered: np 1..5 on one host (the host segment), forced TCP (the ring), mixed hosts (the
hierarchical allgather), a process set leaving out a rank; every dtype; first dims that differ
per rank and per tensor, zero rows included; 64 tensors of different trailing shapes in one
group; a group mixing dtypes (one fused op per dtype); a tensor of over 2 MiB gathered inside a
group (it goes alone, the others fuse around it) and a group cut at 2 MiB per fused op (Note
[Allgather fusion limit]); HVD_FUSION_THRESHOLD small enough to cut
a group into several fused ops (the exact cut is predicted here), and 0 (nothing fuses, same
results); the torch API's grouped_allgather; the timeline's spans of a fused member.
Fusion is proven by the metrics (fused_batches, fused_tensors): the unfused code runs every
tensor alone and counts no fused batch.
"""
import json

import numpy as np
import pytest

from multiproc import checks
from multiproc.checks import ALL_DTYPES, Failures
from multiproc.harness import run_ranks

WIDTHS = [(), (3,), (2, 5), (4, 1, 2)]
MIXED = [np.dtype(np.float32), np.dtype(np.int64), np.dtype(np.float16), np.dtype(np.uint8)]


BIG = 2  # in group "big", the tensor gathered to over 2 MiB (Note [Allgather fusion limit])


def _rows(i, k, kind=""):
    """Rows of tensor i on set rank k: differ per rank and tensor, zero for some."""
    if kind == "big" and i == BIG:
        return 300 + k  # 2048 float32 per row: 2.4 MiB and more per rank
    if kind == "cap":
        return 60 + k  # 1024 float32 per row: 240 KiB and more per rank
    return (i * 7 + k * 3) % 5


def _group(kind):
    """[(dtype, width)] of one of the groups the suites submit."""
    if kind == "big":
        return [(np.dtype(np.float32), (2048,) if i == BIG else (3,)) for i in range(5)]
    if kind == "cap":
        return [(np.dtype(np.float32), (1024,))] * 6
    if kind == "many":
        return [(np.dtype(np.float32), WIDTHS[i % len(WIDTHS)]) for i in range(64)]
    if kind == "mixed":
        return [(MIXED[i % len(MIXED)], WIDTHS[i % 3]) for i in range(8)]
    return [(np.dtype(kind), WIDTHS[i % len(WIDTHS)]) for i in range(3)]


def _gather_group(hvd, fails, kind, tag, members, process_set=None):
    """One grouped allgather of group `kind`; returns (fused batches, fused tensors) it took."""
    me = members.index(hvd.rank())
    group = _group(kind)
    names = [f"{tag}.{i}" for i in range(len(group))]
    arrays = [checks.make_input(d, (_rows(i, me, kind),) + w, hvd.rank(), names[i])
              for i, (d, w) in enumerate(group)]
    before_arrays = [a.copy() for a in arrays]
    kw = {} if process_set is None else {"process_set": process_set}
    m0 = hvd.metrics()
    outs = hvd.grouped_allgather(arrays, name=tag, **kw)
    m1 = hvd.metrics()
    fails.expect(f"{tag} one result per array", len(outs) == len(arrays))
    for i, ((d, w), out) in enumerate(zip(group, outs)):
        expected = np.concatenate([checks.make_input(d, (_rows(i, k, kind),) + w, r, names[i])
                                   for k, r in enumerate(members)])
        fails.check(f"{tag}.{i}", checks.mismatch(out, expected, d))
        fails.expect(f"{tag}.{i} bytes", out.tobytes() == expected.tobytes())
        fails.expect(f"{tag}.{i} input untouched", np.array_equal(arrays[i], before_arrays[i]))
    return (m1["fused_batches"] - m0["fused_batches"], m1["fused_tensors"] - m0["fused_tensors"])


def expected_fusion(kind, set_size, threshold):
    """(fused batches, fused tensors) the coordinator's rules give a group: per dtype, in
    order, a tensor joins the open batch while the gathered bytes stay within the threshold and
    2 MiB; one of over 2 MiB gathered goes alone, leaving the open batch open."""
    if threshold <= 0:
        return 0, 0
    open_bytes, batches = {}, {}
    sizes = []  # [dtype, tensors] of every batch
    for i, (d, w) in enumerate(_group(kind)):
        nbytes = sum(_rows(i, k, kind) for k in range(set_size)) * \
            int(np.prod(w, dtype=np.int64)) * d.itemsize
        if nbytes > 2 << 20:
            continue
        if d in open_bytes and nbytes <= min(threshold, 2 << 20) - open_bytes[d]:
            open_bytes[d] += nbytes
            sizes[batches[d]][1] += 1
            continue
        open_bytes[d], batches[d] = nbytes, len(sizes)
        sizes.append([d, 1])
    fused = [n for _, n in sizes if n > 1]
    return len(fused), sum(fused)


def fusion_suite(transport, kinds):
    """Each group of `kinds` in turn; returns {kind: (fused batches, fused tensors)}."""
    hvd = checks.init(transport)
    fails = Failures()
    members = list(range(hvd.size()))
    taken = {}
    for kind in kinds:
        taken[kind] = _gather_group(hvd, fails, kind, f"g.{kind}", members)
    hvd.shutdown()
    return fails.raise_if_any(), taken


ALL_KINDS = ["many", "mixed", "big", "cap"] + [str(d) for d in ALL_DTYPES]


def _assert_fused(res, kinds, threshold=64 << 20):
    n = len(res)
    for r in res:
        taken = r.value[1]
        for kind in kinds:
            assert taken[kind] == expected_fusion(kind, n, threshold), \
                f"rank {r.rank}, {kind}: took {taken[kind]}, " \
                f"expected {expected_fusion(kind, n, threshold)}"


@pytest.mark.parametrize("np_", [1, 2, 3, 4, 5])
def test_groups_fuse_on_one_host(np_):
    res = run_ranks(fusion_suite, np_, args=("shm", ALL_KINDS), timeout=300)
    _assert_fused(res, ALL_KINDS)
    assert res[0].value[1]["many"] == (1, 64)  # the whole group of 64 is one op
    assert res[0].value[1]["mixed"] == (4, 8)  # one per dtype
    assert res[0].value[1]["big"] == (1, 4)  # the 2.4 MiB tensor alone, the others fused
    # 6 tensors of 240 KiB x np (and more) gathered: batches stop at 2 MiB
    assert res[0].value[1]["cap"] == {1: (1, 6), 2: (2, 6), 3: (3, 6), 4: (3, 6), 5: (0, 0)}[np_]


@pytest.mark.parametrize("np_", [2, 3, 5])
def test_groups_fuse_over_tcp(np_):
    res = run_ranks(fusion_suite, np_, args=("tcp", ALL_KINDS), timeout=400,
                    **checks.world_kwargs(np_, "tcp", {"HVD_LOG": "info"}))
    _assert_fused(res, ALL_KINDS)
    for r in res:
        assert "allgather via ring (pairs)" in r.stderr, r.stderr[-3000:]


def test_groups_fuse_across_mixed_hosts():
    res = run_ranks(fusion_suite, 3, args=("any", ["many", "mixed", "bool"]), timeout=300,
                    hosts=["a", "a", "b"], env={"HVD_LOG": "info"})
    _assert_fused(res, ["many", "mixed", "bool"])
    for r in res:
        assert "allgather via hierarchical" in r.stderr, r.stderr[-3000:]


@pytest.mark.parametrize("threshold", [0, 600, 2000])
def test_threshold_cuts_the_group(threshold):
    # 600 and 2000 bytes: the 64 float32 tensors (0-160 bytes each over 3 ranks) fall into
    # several fused ops; 0: none fuses, and the results are the same.
    kinds = ["many", "mixed", "float64"]
    res = run_ranks(fusion_suite, 3, args=("shm", kinds), timeout=300,
                    env={"HVD_FUSION_THRESHOLD": str(threshold)})
    _assert_fused(res, kinds, threshold)
    batches = res[0].value[1]["many"][0]
    assert (batches == 0) if threshold == 0 else (1 < batches < 64), batches


def subset_suite():
    hvd = checks.init("shm")
    fails = Failures()
    outer = hvd.add_process_set([0, 2])
    try:
        hvd.grouped_allgather([])
        fails.expect("an empty group is refused", False)
    except ValueError as e:
        fails.expect("an empty group is refused", "non-empty list" in str(e), str(e))
    taken = {}
    for k in range(2):
        if hvd.rank() in outer.ranks:
            taken[f"sub.{k}"] = _gather_group(hvd, fails, "many", f"sub.{k}", outer.ranks, outer)
        taken[f"all.{k}"] = _gather_group(hvd, fails, "mixed", f"all.{k}", [0, 1, 2])
    hvd.shutdown()
    return fails.raise_if_any(), taken


def test_process_set_subset_fuses():
    res = run_ranks(subset_suite, 3, timeout=200)
    for r in res:
        taken = r.value[1]
        for k in range(2):
            assert taken[f"all.{k}"] == expected_fusion("mixed", 3, 64 << 20), (r.rank, taken)
            if r.rank != 1:
                assert taken[f"sub.{k}"] == expected_fusion("many", 2, 64 << 20), (r.rank, taken)


def torch_suite():
    import torch

    import engine_native
    import engine_native.torch as hvd
    hvd.init()
    fails = Failures()
    n, me = hvd.size(), hvd.rank()
    ts = [[torch.full((_rows(i, k),) + WIDTHS[i % 4], float(k * 100 + i), dtype=torch.float32)
           for k in range(n)] for i in range(16)]
    m0 = engine_native.metrics()
    outs = hvd.grouped_allgather([t[me] for t in ts], name="tg")
    m1 = engine_native.metrics()
    for i, out in enumerate(outs):
        fails.expect(f"torch.{i}", torch.equal(out, torch.cat(ts[i])), f"{out}")
    hvd.shutdown()
    return fails.raise_if_any(), m1["fused_batches"] - m0["fused_batches"]


def test_torch_grouped_allgather_is_one_op():
    res = run_ranks(torch_suite, 3, timeout=200)
    assert [r.value[1] for r in res] == [1, 1, 1]


def timeline_suite(path):
    hvd = checks.init("shm")
    fails = Failures()
    hvd.start_timeline(path)
    hvd.barrier()
    hvd.grouped_allgather([np.full((hvd.rank() + i, 2), i, np.int32) for i in range(4)],
                          name="tl")
    hvd.barrier()
    hvd.stop_timeline()
    hvd.shutdown()
    return fails.raise_if_any()


def test_timeline_shows_the_fused_op(tmp_path):
    path = str(tmp_path / "timeline.json")
    run_ranks(timeline_suite, 2, args=(path,), timeout=120)
    with open(path) as f:
        events = json.load(f)
    names = {e["pid"]: e["args"]["name"] for e in events
             if e.get("ph") == "M" and e.get("name") == "process_name" and e["pid"] > 0}
    for i in range(4):
        name = f"grouped_allgather.tl_{i}of4"
        pids = [p for p, v in names.items() if v == name]
        assert pids, sorted(names.values())
        spans = [e["name"] for e in events if e["pid"] == pids[0] and e.get("ph") == "B"]
        assert spans == ["NEGOTIATE_ALLGATHER", "ALLGATHER", "MEMCPY_IN_FUSION_BUFFER",
                         "SHM_ALLGATHER", "MEMCPY_OUT_FUSION_BUFFER"], (name, spans)
