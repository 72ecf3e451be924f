"""common/byte_codec.h, the one byte codec under every wire format of the core (control frames,
the mesh handshake, shm offers, negotiation lists), against Python's struct; and the
negotiation decoders over it fed truncated lists, as a hostile or broken peer's
bytes would arrive: each must decode or fail with an error, never read past its input.
Random and mutated inputs for every decoder, under ASan + UBSan: tests/fuzz."""
import struct

import pytest
from native.build_testhooks import load

_hooks = load()  # the test-only extension (tests/native): built here if needed

FIELDS = "BHIiQqd"
VALUES = [0xAB, 0xBEEF, 0xDEADBEEF, -7, 2**64 - 2, -(2**62), 3.25]


def test_fixed_width_fields_are_little_endian_and_round_trip():
    encoded = _hooks.codec_write(FIELDS, VALUES)
    assert encoded == struct.pack("<" + FIELDS, *VALUES)
    assert _hooks.codec_read(encoded, FIELDS) == (VALUES, None)


def test_strings_and_size_vectors_are_length_prefixed():
    encoded = _hooks.codec_write("sz", [b"grad.fc1", [4, 0, 3]])
    assert encoded == struct.pack("<I8sI3q", 8, b"grad.fc1", 3, 4, 0, 3)
    assert _hooks.codec_read(encoded, "sz") == ([b"grad.fc1", [4, 0, 3]], None)


def test_every_truncation_is_reported_never_read_past():
    encoded = _hooks.codec_write(FIELDS + "sz", VALUES + [b"name", [1, 2]])
    for cut in range(len(encoded)):
        values, error = _hooks.codec_read(encoded[:cut], FIELDS + "sz")
        assert error is not None and ("truncated" in error or "overruns" in error), (cut, error)
        assert len(values) < len(FIELDS) + 2


@pytest.mark.parametrize("data, fields, reason", [
    (struct.pack("<I", 0xFFFFFFFF) + b"x" * 8, "s", "exceeds the limit"),   # hostile length
    (struct.pack("<I", 1000) + b"x" * 8, "s", "truncated"),                 # length past the end
    (struct.pack("<I", 2**31) + b"\0" * 16, "z", "overruns input"),          # lying count
    (struct.pack("<Iq", 1, -1), "z", "negative size"),
])
def test_hostile_lengths_and_counts_are_rejected(data, fields, reason):
    values, error = _hooks.codec_read(data, fields)
    assert values == [] and reason in error


def test_intact_negotiation_lists_decode():
    assert _hooks.decode_requests(_hooks.sample_requests()) is None
    assert _hooks.decode_responses(_hooks.sample_responses(False)) is None
    assert _hooks.decode_responses(_hooks.sample_responses(True)) is None


@pytest.mark.parametrize("kind", ["requests", "responses"])
def test_every_prefix_of_a_negotiation_list_is_rejected(kind):
    encoded = (_hooks.sample_requests() if kind == "requests"
               else _hooks.sample_responses(False))
    decode = getattr(_hooks, "decode_" + kind)
    for cut in range(len(encoded)):
        error = decode(encoded[:cut])
        assert error is not None and "malformed" in error, (cut, error)


def test_a_peers_fixed_text_field_is_read_within_the_field():
    """common::fieldText, how the device path reads the error and bus-id fields peers send: up
    to the first NUL, and never past the field when a peer left it unterminated."""
    assert _hooks.field_text(b"GPU 0000:1b:00") == b"GPU 0000:1b:00"
    assert _hooks.field_text(b"ok\0garbage") == b"ok"
    assert _hooks.field_text(b"x" * 40) == b"x" * 16
