"""Snapshot schema: framing, signing, validation of hostile input, mapping of the core's metrics."""

import json

import pytest

from hvd_magic.widgets import snapshot as S

pytestmark = pytest.mark.timeout(30)

KEY = b"k" * 32


def minimal(**extra):
    return {"v": S.SCHEMA_VERSION, "rank": 1, "t": 5.0, **extra}


def test_pack_unpack_round_trip_with_key():
    snap = minimal(seq=3, host="n1", pid=42, busy=True, cell="train()", samples=64,
                   extra={"loss": 0.5, "epoch": 2}, device={"kind": "cuda", "index": 0,
                   "name": "H100", "mem_used": 10, "mem_total": 20},
                   events=[["allreduce", "g", 0.1, 0.01]])
    assert S.unpack(S.pack(snap, KEY), KEY) == snap


@pytest.mark.parametrize("sender_key, receiver_key", [(b"other", KEY), (None, KEY)])
def test_frames_signed_with_another_key_or_unsigned_are_rejected(sender_key, receiver_key):
    with pytest.raises(ValueError, match="bad signature"):
        S.unpack(S.pack(minimal(), sender_key), receiver_key)


def test_tampered_payload_is_rejected():
    frame = bytearray(S.pack(minimal(samples=1), KEY))
    frame[-3] ^= 1
    with pytest.raises(ValueError):
        S.unpack(bytes(frame), KEY)


@pytest.mark.parametrize("payload, match", [
    (b"[1, 2]", "expected a JSON object"),
    (b'{"v": 99, "rank": 0, "t": 1}', "schema version 1, got 99"),
    (b'{"v": 1, "rank": -1, "t": 1}', "integer rank"),
    (b'{"v": 1, "rank": true, "t": 1}', "integer rank"),
    (b'{"v": 1, "rank": 0}', "float 't'"),
    (b"\xff\xfe", "invalid JSON"),
])
def test_malformed_payloads_raise_value_error(payload, match):
    with pytest.raises(ValueError, match=match):
        S.unpack(bytes(32) + payload)


def test_oversized_frame_is_rejected_before_parsing():
    with pytest.raises(ValueError, match="size"):
        S.unpack(bytes(32) + b" " * S.MAX_FRAME_BYTES)


def test_validate_drops_unknown_and_mistyped_fields_and_clips_text():
    obj = minimal(evil="x", pid="12", samples=-5, host="h" * 5000, busy="yes",
                  extra={"loss": 0.1, "bad": [1], **{f"k{i}": i for i in range(40)}},
                  core={"ops": {"allreduce": 3, "bogus": 1, "broadcast": "x"},
                        "collective": {"op": "allreduce", "name": "<b>", "age_s": 2,
                                       "missing": [1, "2"]},
                        "transport": {"0": "shm"}, "queue_depth": 1.5},
                  events=[["allreduce", "g", 0.1, 0.2], ["bad"], ["a", "b", "c", 1]])
    out = S.validate(json.loads(json.dumps(obj)))
    assert set(out) == {"v", "rank", "t", "host", "extra", "core", "events"}
    assert len(out["host"]) == S.MAX_TEXT
    assert len(out["extra"]) == S.MAX_EXTRA and "bad" not in out["extra"]
    assert out["core"]["ops"] == {"allreduce": 3}
    assert out["core"]["collective"]["missing"] == [1]
    assert "queue_depth" not in out["core"]
    assert out["events"] == [["allreduce", "g", 0.1, 0.2]]


def test_normalize_core_maps_the_native_metrics_layout():
    raw = {  # engine_native/csrc/runtime/metrics.h MetricsSnapshot, as the binding returns it
        "ops": [5, 0, 1, 0, 0, 2, 0], "bytes": [4096, 0, 64, 0, 0, 0, 0],
        "fused_batches": 2, "fused_tensors": 5, "negotiate_seconds": 0.5,
        "communicate_seconds": 1.5, "wait_seconds": 2.5, "queue_depth": 3, "last_error": "",
        "current_op": "ALLREDUCE", "current_name": "fused", "current_seconds": 0.2,
        "pending": [{"name": "grad.w", "op": "ALLGATHER", "age_seconds": 4.0,
                     "missing_ranks": [2]}],
        "transports": ["self", "shm", "", "tcp"],
    }
    core = S.normalize_core(raw)
    assert core["ops"] == {"allreduce": 5, "broadcast": 1, "barrier": 2}
    assert core["bytes"] == {"allreduce": 4096, "broadcast": 64}
    assert (core["negotiate_s"], core["communicate_s"], core["idle_s"]) == (0.5, 1.5, 2.5)
    assert "wait_s" not in core  # the core's wait_seconds is its loop's idle poll today
    assert core["collective"] == {"op": "allgather", "name": "grad.w", "age_s": 4.0,
                                  "phase": "negotiate", "missing": [2]}
    assert core["transport"] == {"0": "self", "1": "shm", "3": "tcp"}
    snap = S.validate(minimal(core=core))  # what the publisher sends survives validation
    assert snap["core"]["fused_tensors"] == 5 and snap["core"]["queue_depth"] == 3


def test_point_to_point_counters_travel_as_send_and_recv():
    raw = {"ops": {"ALLREDUCE": 1}, "bytes": {"ALLREDUCE": 8}, "p2p_sent": 3,
           "p2p_sent_bytes": 3000, "p2p_received": 2, "p2p_received_bytes": 1024}
    core = S.normalize_core(raw)
    assert core["ops"] == {"allreduce": 1, "send": 3, "recv": 2}
    assert core["bytes"] == {"allreduce": 8, "send": 3000, "recv": 1024}
    assert S.validate(minimal(core=core))["core"]["bytes"] == core["bytes"]
    assert S.normalize_core({"p2p_sent": 0})["ops"] == {}  # nothing sent: nothing shown


@pytest.mark.parametrize("raw, expected", [
    ({"wait_seconds": 2.0, "idle_seconds": 3.0}, {"wait_s": 2.0, "idle_s": 3.0}),
    ({"wait_seconds": 3.0, "handle_wait_seconds": 2.0}, {"wait_s": 2.0, "idle_s": 3.0}),
    ({"wait_s": 2.0, "idle_s": 3.0}, {"wait_s": 2.0, "idle_s": 3.0}),
])
def test_normalize_core_separates_framework_wait_from_loop_idle(raw, expected):
    core = S.normalize_core(raw)
    assert {k: core[k] for k in ("wait_s", "idle_s")} == expected


def test_normalize_core_picks_the_executing_op_when_it_is_older():
    core = S.normalize_core({"current_op": "BROADCAST", "current_name": "p", "current_seconds": 9.0,
                             "pending": [{"name": "g", "op": "ALLREDUCE", "age_seconds": 1.0}]})
    assert (core["collective"]["op"], core["collective"]["phase"]) == ("broadcast", "execute")
    assert S.normalize_core({})["collective"] is None


def test_merged_events_carry_a_count_and_busy_time():
    obj = minimal(events=[["allreduce", "g", 0.3, 0.2, 40, 0.1],
                          ["allreduce", "g", 0.1, 0.2, 1, 0.2],  # a count of 1: plain event
                          ["allreduce", "g", 0.1, 0.2, 0, 0.1],
                          ["allreduce", "g", 0.1, 0.2, "x", 1],
                          ["allreduce", "g", 0.1, 0.2, 3]])
    assert S.validate(obj)["events"] == [["allreduce", "g", 0.3, 0.2, 40, 0.1],
                                         ["allreduce", "g", 0.1, 0.2]]
