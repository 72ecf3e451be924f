// Executor: runs one negotiated Response on this rank — copies into the persistent fusion
// buffer, applies scales, calls the algorithm, copies out, and completes the handles. Called
// only by the background thread, in response-list order (the order every rank shares).
// A transport failure (lost peer, timeout, abort) is returned so the loop can fail the core;
// an error Response (mismatch) completes its handles with that error and leaves the core usable.
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "coord/message.h"
#include "runtime/handle_table.h"
#include "runtime/metrics.h"
#include "runtime/tensor_entry.h"
#include "transport/comm.h"

namespace hvd::runtime {

class Executor {
 public:
  Executor(HandleTable& handles, Metrics& metrics, const common::Config& config);

  // Takes the response's entries out of `table` (absent entries belong to joined ranks and
  // contribute zeros) and completes their handles.
  common::Status execute(const coord::Response& response, EntryTable& table,
                         transport::Comm& comm);

 private:
  common::Status allreduce(const coord::Response& r, std::vector<TensorEntry*>& entries,
                           transport::Comm& comm);
  common::Status allgather(const coord::Response& r, TensorEntry* entry, transport::Comm& comm,
                           OpResult* result);
  common::Status broadcast(const coord::Response& r, TensorEntry* entry, transport::Comm& comm);
  common::Status alltoall(const coord::Response& r, TensorEntry* entry, transport::Comm& comm,
                          OpResult* result);
  common::Status reducescatter(const coord::Response& r, TensorEntry* entry,
                               transport::Comm& comm, OpResult* result);
  uint8_t* fusionBuffer(size_t bytes);

  HandleTable& handles_;
  Metrics& metrics_;
  const common::Config& config_;
  std::vector<uint8_t> fusion_buffer_;  // persistent; grows to the largest fused batch
  std::vector<uint8_t> zeros_;          // a joined rank's contribution
};

}  // namespace hvd::runtime
