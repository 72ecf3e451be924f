"""Build ``fuzz_decoders``, the decoder fuzz driver (tests/fuzz/driver/*.cc), under
AddressSanitizer + UndefinedBehaviorSanitizer, linked with only the core sources its decoders
need. Built here at test time, never by setup.py.

    python tests/fuzz/build_fuzzer.py         # build now (or reuse), print the binary's path

The binary lives in ``build/fuzz/<digest>/`` of the checkout (git-ignored): an unchanged tree
reuses it, a changed one builds anew (about 40 s on two cores). A failed build raises with the
compiler's output, so the fuzz tests fail, never skip.
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # tests/, for native.build_testhooks

from native.build_testhooks import CSRC, REPO, build_into, tree_digest

OUT = os.path.join(REPO, "build", "fuzz")
DRIVER = os.path.join(HERE, "driver")
SEEDS = os.path.join(HERE, "seeds")
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all",
            "-fno-omit-frame-pointer"]

DRIVER_SOURCES = ["main.cc", "targets_common.cc", "targets_coord.cc", "targets_transport.cc",
                  "targets_shm_setup.cc", "targets_runtime.cc"]
# The decoders and what they call, spelled as in setup.py's CORE_SOURCES.
CORE = [
    "common/byte_codec.cc",
    "common/cpu_ranges.cc",
    "common/dtype.cc",
    "common/hmac.cc",
    "common/logging.cc",
    "coord/key_table.cc",
    "coord/wire.cc",
    "coord/request_cache.cc",
    "coord/response_cache.cc",
    "coord/message.cc",
    "transport/tcp/socket.cc",
    "transport/tcp/handshake.cc",
    "transport/shm/shared_mapping.cc",
    "transport/shm/segment.cc",
    "transport/shm/offer.cc",
    "transport/shm/setup.cc",
    "transport/shm/collective_segment.cc",
    "transport/shm/host_agreement.cc",
    "transport/shm/ring_stream.cc",
    "transport/control.cc",
    "transport/peer_frame.cc",
    "transport/peer_channel.cc",
    "transport/peer_split.cc",
    "transport/shm/cross_memory.cc",
    "transport/shm/helper_read.cc",
    "runtime/one_round_post.cc",
    "runtime/one_round_respond.cc",
    "coord/validation.cc",
]


def _flags() -> list:
    # -O1 and line tables (-g1): the sanitizers' advice (fast enough; reports name file:line,
    # inlined frames included), a quarter less compile time than full -g; warnings as in
    # setup.py.
    return ["-std=c++17", "-O1", "-g1", "-Wall", "-Wextra", "-Werror", "-pthread",
            "-I" + CSRC] + SANITIZE


def _sources() -> list:
    return ([os.path.join(DRIVER, s) for s in DRIVER_SOURCES] +
            [os.path.join(CSRC, s) for s in CORE])


def build() -> str:
    """Path of an up-to-date fuzz_decoders binary, building it when needed."""
    digest = tree_digest(_sources(), _flags(), (CSRC, DRIVER))
    return build_into(OUT, digest, "fuzz_decoders", _sources(), _flags(),
                      SANITIZE + ["-pthread"])


if __name__ == "__main__":
    print(build())
