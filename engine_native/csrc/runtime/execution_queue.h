// ExecutionQueue: the agreed work of this rank, run in the order rank 0 produced it (every rank
// executes the responses of its process sets in that order), and the connections of each
// process set. BackgroundLoop (background_loop.h) appends what rank 0 sends (on rank 0, what it
// releases) and run()s the queue each pass; a staged CUDA op at its head waits, without
// blocking the loop, for its inputs to reach host memory. An autotune switch takes effect at
// its place in the queue. Background thread only (whichever thread holds the loop's progress_).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/config.h"
#include "common/status.h"
#include "coord/key_table.h"
#include "coord/message.h"
#include "runtime/autotuner.h"
#include "runtime/executor.h"
#include "runtime/metrics.h"
#include "runtime/process_sets.h"
#include "runtime/tensor_entry.h"
#include "transport/mesh.h"

namespace hvd::runtime {

class ExecutionQueue {
 public:
  // `autotuner` may be null. Everything here outlives the queue; `entries` are the loop's.
  ExecutionQueue(transport::Mesh& mesh, ProcessSetTable& sets, const common::Config& config,
                 Metrics& metrics, Executor& executor, const coord::KeyTable& keys,
                 EntryTable& entries, Autotuner* autotuner);

  // An autotune switch: it takes effect before the responses queued after it.
  void pushParams(const coord::ParamsUpdate& params);
  void push(coord::Response&& response);
  // Runs the queue up to its end, a staged op still waiting for its inputs, or the first
  // failure, which it returns (the caller fails the core). The loop's fail() clear()s the
  // queue, so a failure met inside an op (Executor's failure refiner) also ends the run.
  common::Status run();
  // Runs a one-round op of the global set now, from the board's bytes (Note [One round] in
  // one_round.cc): it is not in the queue, and no rank's queue orders it.
  common::Status runOneRound(const coord::Response& response, const OneRoundInputs& inputs);
  bool empty() const { return to_execute_.empty(); }
  // The global set's joins executed (completed) on this rank so far (Note [One round] J).
  uint64_t globalJoins() const { return global_joins_; }
  bool waitingForDevice() const { return waiting_for_device_; }
  void clear() { to_execute_.clear(); }
  void markKeys(const coord::KeyTable::MarkFn& mark) const;

 private:
  struct CommSlot {
    std::unique_ptr<transport::Comm> comm;
    std::string transport;  // "SHM" / "TCP" (any TCP peer), for timeline activity names
  };
  // One unit of work in execution order: a response, or an autotune switch.
  struct Work {
    std::optional<coord::ParamsUpdate> params;
    coord::Response response;
  };

  CommSlot& commFor(int32_t process_set);
  void dropRemovedSets();
  void applyParams(const coord::ParamsUpdate& update);
  void observeExecuted(const coord::Response& response, const common::Status& status);

  transport::Mesh& mesh_;
  ProcessSetTable& sets_;
  const common::Config& config_;
  Metrics& metrics_;
  Executor& executor_;
  const coord::KeyTable& keys_;
  EntryTable& entries_;
  Autotuner* autotuner_;
  std::deque<Work> to_execute_;
  bool waiting_for_device_ = false;  // its head is a staged CUDA op whose inputs are in transit
  uint64_t global_responses_ = 0;  // global-set responses executed (autotune switch points)
  uint64_t global_joins_ = 0;
  std::map<int32_t, CommSlot> comms_;
  uint64_t comms_version_ = 0;  // sets_.version() comms_ was last pruned at
};

}  // namespace hvd::runtime
