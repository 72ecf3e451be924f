"""common/hmac.cc, the core's hand-written SHA-256 and HMAC-SHA256 (the TCP handshake's proof of
the job secret), against the published test vectors and Python's hashlib/hmac (issue #35).
Both ends of a handshake run this code, so a consistent bug would authenticate happily: only
outside references catch one."""
import hashlib
import hmac
import random

import pytest
from native.build_testhooks import load

_hooks = load()  # the test-only extension (tests/native): built here if needed

# RFC 4231 section 4: HMAC-SHA-256 test cases 1-7 (case 5 is truncated to 128 bits).
RFC4231 = [
    (b"\x0b" * 20, b"Hi There",
     "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"),
    (b"Jefe", b"what do ya want for nothing?",
     "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"),
    (b"\xaa" * 20, b"\xdd" * 50,
     "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"),
    (bytes(range(1, 26)), b"\xcd" * 50,
     "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"),
    (b"\x0c" * 20, b"Test With Truncation", "a3b6167473100ee06e0c796c2955552b"),
    (b"\xaa" * 131, b"Test Using Larger Than Block-Size Key - Hash Key First",
     "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"),
    (b"\xaa" * 131, b"This is a test using a larger than block-size key and a larger than "
     b"block-size data. The key needs to be hashed before being used by the HMAC algorithm.",
     "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"),
]

# FIPS 180-2 appendix B (one block, two blocks, a million bytes) and the empty message.
SHA256 = [
    (b"abc", "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
    (b"", "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
    (b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq",
     "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1"),
    (b"a" * 1_000_000, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
]


@pytest.mark.parametrize("key, data, want", RFC4231, ids=[f"case{i}" for i in range(1, 8)])
def test_hmac_sha256_matches_rfc4231(key, data, want):
    assert _hooks.hmac_sha256(key, data).hex()[:len(want)] == want


@pytest.mark.parametrize("message, want", SHA256, ids=["abc", "empty", "two-blocks", "million"])
def test_sha256_matches_fips_180(message, want):
    assert _hooks.sha256(message).hex() == want
    # fed in pieces that straddle the 64-byte blocks: the same digest
    for chunk in (1, 3, 63, 64, 65, 1000):
        if chunk < len(message) or not message:
            assert _hooks.sha256(message, chunk).hex() == want, chunk


def test_every_length_around_the_padding_boundaries_matches_hashlib():
    """Lengths where the padding spills into a second block (55/56 bytes mod 64) and keys
    around the block size (hashed when longer than 64 bytes), on random bytes."""
    rng = random.Random(4231)
    for n in list(range(0, 200)) + [447, 448, 1023, 1024, 4097]:
        data = rng.randbytes(n)
        assert _hooks.sha256(data) == hashlib.sha256(data).digest(), n
    for key_len in (0, 1, 31, 32, 63, 64, 65, 127, 128, 129, 300):
        key = rng.randbytes(key_len)
        for n in (0, 1, 55, 56, 64, 119, 120, 1000):
            data = rng.randbytes(n)
            assert _hooks.hmac_sha256(key, data) == hmac.new(key, data, hashlib.sha256).digest(), \
                (key_len, n)


def test_constant_time_equal_finds_any_differing_byte():
    rng = random.Random(7)
    a = rng.randbytes(32)
    assert _hooks.constant_time_equal(a, bytes(a))
    for i in range(32):
        for bit in (0x01, 0x80):
            b = bytearray(a)
            b[i] ^= bit
            assert not _hooks.constant_time_equal(a, bytes(b)), (i, bit)
    assert _hooks.constant_time_equal(b"", b"")
