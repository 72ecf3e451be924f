// Single-copy host collectives: every rank of the host publishes where its input lies
// (transport/shm/collective_segment.h PeerRegion) and the ranks that need it read it straight
// into their output with process_vm_readv (transport/shm/cross_memory.h); nothing goes through
// the segment's slots. Note [Single-copy ops] in single_copy.cc. Background thread only
// (whichever thread holds the loop's progress_: the loop thread or a caller driving it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "common/status.h"
#include "transport/shm/collective_sync.h"

namespace hvd::algo {

// Whether an op moving up to `largest` bytes from one rank to another takes the single-copy
// path: the host agreed on a scope that takes in `needs` (broadcast: kBroadcast; allgather
// and alltoall: kEveryOp) and probed it usable, and `largest` is at least the host's
// HVD_SINGLE_COPY_MIN_BYTES (Note [Single-copy threshold] in single_copy.cc).
bool singleCopyServes(const transport::shm::CollectiveSync& sync, size_t largest,
                      transport::shm::SingleCopyScope needs);

// Where a peer's input lies, as it published it for this op.
struct PeerInput {
  int pid = 0;
  uint64_t address = 0;
  uint64_t bytes = 0;
  uint64_t layout = 0;  // the address of an op-defined table in the peer (alltoall's offsets)
};

// One single-copy op on every rank of the host alike:
//   publish (in, bytes, layout) and post; run `local` (this rank's own part, overlapping the
//   peers' reads); wait until every rank in `sources` (all others when `sources` < 0, else
//   that local index alone, or none when this rank is the only source) posted; call `read`
//   for each source; release; and, when `read_by_others`, wait until every other rank
//   released, so this rank's input outlives every read of it.
struct SingleCopyOp {
  const void* in = nullptr;
  size_t bytes = 0;
  uint64_t layout = 0;
  int source = -1;            // local index of the only rank read, or -1 for every other rank
  bool read_by_others = true;
  std::function<void()> local;
  std::function<common::Status(int local_index, const PeerInput& peer)> read;
};
common::Status runSingleCopy(transport::shm::CollectiveSync& sync, const SingleCopyOp& op);

// Ops this process ran through runSingleCopy since it started (metrics()["single_copy_ops"]).
uint64_t singleCopyOps();

}  // namespace hvd::algo
