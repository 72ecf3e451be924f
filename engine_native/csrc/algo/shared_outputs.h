// Host collectives that write into the ranks' outputs directly: every rank's output is a shared
// block (transport/shm/shared_blocks.h) and each rank copies what it sends straight into the
// receivers' outputs, once (Note [Shared outputs] in shared_outputs.cc). alltoall and
// allgather use it. Background thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <utility>
#include <vector>

#include "algo/algorithms.h"
#include "common/status.h"
#include "transport/comm.h"
#include "transport/shm/collective_sync.h"

namespace hvd::algo {

// Whether an op whose largest transfer between two ranks is `largest` bytes writes into the
// outputs (the host probed it possible and `largest` is large enough): then the caller takes
// every rank's output from shared blocks (runtime/host_output_pool.h hostOutput(bytes, true))
// and says so to the algorithm. The same on every rank of the Comm.
bool writesIntoOutputs(const transport::Comm& comm, size_t largest,
                       const AllreduceChoice& choice);

// One op, run by every rank of the host alike.
struct SharedOutputOp {
  const char* name = "";             // "alltoall", "allgather": for errors
  uint8_t* out = nullptr;            // this rank's output, in a shared block
  size_t out_bytes = 0;
  std::vector<uint64_t> landing;     // by local index j: where j's block lands in `out`
  std::vector<uint64_t> expected;    // by local index j: the bytes of j's block
  // What this rank sends to local index j, itself included: {address, bytes}, bytes may be 0.
  std::function<std::pair<const uint8_t*, size_t>(int j)> block_for;
};
// *use_slots: some rank's output is not in a shared block; nothing was written and every rank
// must now run the op through the slots (it consumed one chunk: construct the slot op afresh).
common::Status runSharedOutputs(transport::shm::CollectiveSync& sync, const SharedOutputOp& op,
                                bool* use_slots);

// Ops this process wrote into outputs since it started, and ops that fell back to the slots
// because some rank's output was not shared (metrics).
uint64_t sharedOutputOps();
uint64_t sharedOutputFallbacks();

}  // namespace hvd::algo
