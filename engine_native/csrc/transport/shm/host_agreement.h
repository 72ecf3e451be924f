// The two message exchanges every host probe shares (Note [Single-copy probe] in
// cross_memory.cc, Note [Shared-output probe] in shared_blocks.cc), between the host's leader
// (its lowest rank) and every other rank, over the authenticated data sockets:
//   hostBarrier     every rank has published what the others will check (step J);
//   agreeOnVerdict  the leader gathers each rank's verdict and sends every rank the first
//                   refusal, or fine (step L), so the whole host takes one path.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"
#include "transport/tcp/socket.h"

namespace hvd::transport::shm {

// On the wire (common/byte_codec.h): u32 refusal, i32 rank, i32 peer, u32 0.
struct ProbeVerdict {
  uint32_t refusal = 0;  // 0: fine; else a probe-defined reason
  int32_t rank = -1;     // global rank that refused
  int32_t peer = -1;     // global rank it could not reach, where that is the reason
};

// Sets *self to `rank`'s index in host_ranks; an internal error naming `probe` when it is not
// there or the host's size is not the segment's `local_size`.
common::Status hostIndexOf(const std::vector<int>& host_ranks, int rank, int local_size,
                           const char* probe, int* self);

// host_ranks: the host's global ranks, ascending; fds: data socket per global rank; self:
// this rank's index in host_ranks.
common::Status hostBarrier(const std::vector<int>& host_ranks, const std::vector<int>& fds,
                           int self, tcp::Deadline deadline);
common::Status agreeOnVerdict(const std::vector<int>& host_ranks, const std::vector<int>& fds,
                              int self, const ProbeVerdict& mine, ProbeVerdict* host,
                              tcp::Deadline deadline);

}  // namespace hvd::transport::shm
