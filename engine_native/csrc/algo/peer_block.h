// The check every single-copy read (Note [Single-copy ops] in algo/single_copy.cc) makes
// before it reads a peer's bytes: the block the peer published for this rank is the size this
// rank expects and lies inside the peer's published input. The numbers come from another
// process's memory, so nothing may overflow on them (no `at + want`), and a disagreement is
// an internal error that names both sizes instead of a read of the wrong range.
// Header-only so the unit tests (tests/native/testhooks) run it without the transport.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"

namespace hvd::algo {

// op: "broadcast", "allgather", "alltoall"; local: the peer's local index; input_bytes: the
// size of the peer's whole published input; at, published: where the block for this rank
// starts in it and its size, as the peer published them; want: the size this rank expects.
inline common::Status checkPeerBlock(const char* op, int local, uint64_t input_bytes,
                                     uint64_t at, uint64_t published, uint64_t want) {
  const std::string who = std::string("single-copy ") + op + ": local rank " +
                          std::to_string(local);
  if (published != want) {
    return common::internalError(who + " published " + std::to_string(published) +
                                 " bytes for this rank, which expects " +
                                 std::to_string(want) + ": the ranks' sizes disagree");
  }
  if (at > input_bytes || want > input_bytes - at) {
    return common::internalError(who + " published a block of " + std::to_string(want) +
                                 " bytes at offset " + std::to_string(at) + " of its " +
                                 std::to_string(input_bytes) + "-byte input: it lies outside");
  }
  return common::Status::ok();
}

}  // namespace hvd::algo
