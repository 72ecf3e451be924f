// Executor: runs one negotiated Response on this rank — copies into the persistent fusion
// buffer, applies scales, calls the algorithm, copies out, and completes the handles. Called
// only by the background thread, in response-list order (the order every rank shares).
// A transport failure (lost peer, timeout, abort) is returned so the loop can fail the core;
// an error Response (mismatch) completes its handles with that error and leaves the core usable.
// Execution is recorded on the timeline (when given) before the handles complete: per name an
// <OP> span with dtype/shape, nested activities (MEMCPY_IN/OUT_FUSION_BUFFER for fused batches,
// <TRANSPORT>_<OP> around the algorithm), ended with the error text on failure; without a
// file, one span per response for the live strip (Note [Timeline detail] in executor.cc).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "algo/algorithms.h"
#include "common/config.h"
#include "common/status.h"
#include "coord/message.h"
#include "runtime/handle_table.h"
#include "runtime/metrics.h"
#include "runtime/tensor_entry.h"
#include "timeline/timeline.h"
#include "transport/comm.h"

namespace hvd::runtime {

class Executor {
 public:
  // `timeline` may be null (no recording); it and `keys` (names for the timeline) outlive the
  // executor.
  Executor(HandleTable& handles, Metrics& metrics, const common::Config& config,
           timeline::Timeline* timeline, const coord::KeyTable& keys);

  // Runs the response on its entries in `table` (absent entries belong to joined ranks and
  // contribute zeros), completes their handles and removes them. `transport` names how this
  // rank reaches the set's peers ("SHM", "TCP"; a set spanning both is "TCP"), for activity
  // names.
  common::Status execute(const coord::Response& response, EntryTable& table,
                         transport::Comm& comm, const std::string& transport);

  // Called with a failed op's Status before its handles complete; may return a better cause
  // (Note [Failure fan-out] in background_loop.cc).
  void setFailureRefiner(std::function<common::Status(const common::Status&)> refine) {
    refine_ = std::move(refine);
  }

  // Note [Runtime allreduce choice]: hierarchical allreduce is the value currently in force,
  // which autotune may switch between responses (identically on every rank), so the allreduce
  // dispatcher reads hierarchicalAllreduce(), never config_.hierarchical_allreduce.
  void setHierarchicalAllreduce(bool on) { hierarchical_.store(on, std::memory_order_relaxed); }
  bool hierarchicalAllreduce() const { return hierarchical_.load(std::memory_order_relaxed); }
  // Per-tensor spans and activities while a timeline file is written (any thread).
  void setTimelineDetail(bool on) { detailed_.store(on, std::memory_order_relaxed); }

 private:
  // entries: one per response key, nullptr where this rank has none (a joined rank).
  common::Status allreduce(const coord::Response& r, const std::vector<TensorEntry*>& entries,
                           transport::Comm& comm);
  // Note [Fusion without a buffer]: false when the batch must be packed instead.
  bool allreduceTensors(const coord::Response& r, const std::vector<TensorEntry*>& entries,
                        transport::Comm& comm, const algo::AllreduceChoice& choice,
                        size_t total, common::Status* status);
  common::Status allgather(const coord::Response& r, TensorEntry* entry, transport::Comm& comm,
                           OpResult* result);
  common::Status broadcast(const coord::Response& r, TensorEntry* entry, transport::Comm& comm);
  common::Status alltoall(const coord::Response& r, TensorEntry* entry, transport::Comm& comm,
                          OpResult* result);
  common::Status reducescatter(const coord::Response& r, TensorEntry* entry,
                               transport::Comm& comm, OpResult* result);
  uint8_t* fusionBuffer(size_t bytes);
  bool recording() const { return timeline_ != nullptr && timeline_->enabled(); }
  void recordStart(const coord::Response& r, const std::vector<TensorEntry*>& entries);
  void complete(const common::Status& status, const OpResult& result);
  // `activity` starting with '_' is prefixed with the transport ("_ALLREDUCE" -> SHM_ALLREDUCE).
  void activityStartAll(const coord::Response& r, const char* activity);
  void activityEndAll(const coord::Response& r);
  void recordEnd(const coord::Response& r, const std::string& error);

  HandleTable& handles_;
  Metrics& metrics_;
  const common::Config& config_;
  timeline::Timeline* timeline_;
  const coord::KeyTable& keys_;
  std::atomic<bool> hierarchical_{false};
  std::atomic<bool> detailed_{false};  // Note [Timeline detail] in executor.cc
  bool detailed_now_ = false;          // for the response being executed
  std::string summary_;                // its strip track when not detailed
  std::string transport_;              // of the response being executed
  std::vector<uint8_t> fusion_buffer_;  // persistent; grows to the largest fused batch
  std::vector<TensorEntry*> entries_;   // of the response being executed, per key
  std::vector<algo::TensorSpan> spans_;  // its tensors, when the algorithm takes them directly
  std::vector<int64_t> done_handles_;   // its handles, completed together
  std::vector<uint8_t> zeros_;          // a joined rank's contribution
  std::function<common::Status(const common::Status&)> refine_;
};

}  // namespace hvd::runtime
