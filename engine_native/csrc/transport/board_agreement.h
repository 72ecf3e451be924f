// The one-round board's size limit, agreed by the whole world at connect (Note [One round] K
// in runtime/one_round.cc). Each rank's wish is HVD_ONE_ROUND_BYTES (0: no board); the ranks of
// a host's collective segment already agreed on their least (Note [Collective setup] H), so a
// rank tells that verdict to every rank off its segment, over their point-to-point sockets
// before the loop uses them, and takes the least of all it hears: the same on every rank, so
// the board is on for all or for none. Bootstrap thread (Mesh::connect).
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "transport/tcp/socket.h"

namespace hvd::transport {

// Writes `mine` to every fd of `fds` (ranks `ranks`), then reads each one's; *agreed is the
// least. kInternal naming the rank for a wish above `max_bytes` (not a rank of this code).
common::Status agreeBoardBytes(const std::vector<int>& ranks, const std::vector<int>& fds,
                               uint32_t mine, uint32_t max_bytes, tcp::Deadline deadline,
                               uint32_t* agreed);

}  // namespace hvd::transport
