// OpExecutor: how one negotiated Response runs on this rank's memory — the interface that the
// CPU implementation (cpu_executor.h) and the device implementation (device_executor.h) share,
// as gloo's cuda_* algorithms mirror its CPU ones. The Executor (executor.h) picks one per
// response by its device, records the timeline around it and completes the handles.
// Background thread only (whichever thread holds the loop's progress lock).
#pragma once

#include <vector>

#include "algo/algorithms.h"
#include "common/status.h"
#include "coord/message.h"
#include "runtime/handle_table.h"
#include "runtime/tensor_entry.h"
#include "transport/comm.h"

namespace hvd::runtime {

// Activities an implementation reports while it runs a response (MEMCPY_IN_FUSION_BUFFER,
// <TRANSPORT>_<OP>, ...). A name starting with '_' gets the transport as prefix.
class ActivityLog {
 public:
  virtual ~ActivityLog() = default;
  virtual void start(const char* activity) = 0;
  virtual void end() = 0;
};

// A one-round op's inputs (Note [One round] in one_round.cc): per set rank, the bytes that
// rank posted on the board (an allreduce's prescaled input; a broadcast's root only, the
// others nullptr). The Executor runs such a response from these, with no exchange.
struct OneRoundInputs {
  std::vector<const uint8_t*> by_rank;
};

// One response being executed. entries: one per response key, nullptr where this rank has
// none (it joined: it contributes zeros, or nothing to an allgather).
struct OpContext {
  const coord::Response& response;
  const std::vector<TensorEntry*>& entries;
  transport::Comm& comm;
  ActivityLog& activities;
  const algo::AllreduceChoice& choice;  // the same on every rank (Note [Runtime allreduce choice])
  OpResult* result;  // outputs the core allocates (allgather, alltoall, reducescatter)
  // A fused allgather's outputs, one per response key (filled instead of result); the Executor
  // completes each key's handle with its own.
  std::vector<OpResult>* key_results = nullptr;
  const OneRoundInputs* one_round = nullptr;  // set: the data came with the agreement
};

class OpExecutor {
 public:
  virtual ~OpExecutor() = default;
  virtual common::Status allreduce(OpContext& op) = 0;
  virtual common::Status allgather(OpContext& op) = 0;
  virtual common::Status broadcast(OpContext& op) = 0;
  virtual common::Status alltoall(OpContext& op) = 0;
  virtual common::Status reducescatter(OpContext& op) = 0;
};

}  // namespace hvd::runtime
