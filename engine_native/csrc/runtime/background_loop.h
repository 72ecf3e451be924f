// BackgroundLoop: the one progress loop per process that owns all communication. Framework
// threads submit() entries and get woken through handles; the loop reads like a table of
// contents: wait for work -> drain submissions -> negotiate (workers send requests to rank 0,
// rank 0 coordinates and sends responses) -> execute responses in order -> complete the CUDA
// ops whose stream work has run (Note [Deferred completion]) -> inspect stalls.
// A pass of that loop may also run on a framework thread that is about to block on its own op
// (drive(), Note [Caller drives] in caller_drives.cc): passes are serialised by progress_,
// so "the background thread" below means whichever thread holds it.
// Rule relied on: every rank executes the responses of its process sets in the order rank 0
// produced them, so collectives never interleave differently across ranks.
// Failure (lost peer, timeout, abort) is sticky: pending and later ops fail with the stored
// Status until shutdown(); init() afterwards builds a fresh loop.
// It is also the timeline's only recorder (negotiation on rank 0 here, execution in the
// Executor) and drives autotune (runtime/autotuner.h): a new setting travels with the next
// ResponseList and every rank applies it at the same point of the response stream.
// Tensors are known by their keys (coord/key_table.h): per-tensor state sits in slots indexed by
// key, which keep their storage from step to step, so a repeated training step negotiates and
// executes without allocating.
#pragma once

#include <atomic>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/config.h"
#include "coord/response_cache.h"
#include "runtime/autotuner.h"
#include "runtime/executor.h"
#include "runtime/handle_table.h"
#include "runtime/metrics.h"
#include "runtime/process_sets.h"
#include "runtime/rank_zero_coordinator.h"
#include "runtime/submission_queue.h"
#include "runtime/tensor_entry.h"
#include "timeline/timeline.h"
#include "transport/mesh.h"

namespace hvd::runtime {

class BackgroundLoop {
  using Clock = std::chrono::steady_clock;

 public:
  // `timeline` and `autotuner` may be null; both outlive the loop.
  BackgroundLoop(transport::Mesh& mesh, HandleTable& handles, ProcessSetTable& sets,
                 Metrics& metrics, const common::Config& config, timeline::Timeline* timeline,
                 Autotuner* autotuner);
  ~BackgroundLoop();

  void start();
  // Framework threads. Takes the entries (all or none: a duplicate name fails the call) and
  // fills in their keys and handles; each handle holds its name until the user has seen the
  // op finish (Note [Name lifetime] in handle_table.h). Fails at once with the stored failure
  // when the core has failed.
  // wake=false: the caller waits for these entries at once and drive()s them itself.
  common::Status submit(TensorEntry* entries, const std::string_view* names, size_t count,
                        bool wake = true);
  // Framework threads about to block on `handle`: run passes on this thread for up to
  // HVD_CALLER_SPIN_US (one pass when spinning would steal a core). True when the handle
  // finished here; false means the caller must block on it (the loop thread took over).
  bool drive(int64_t handle);
  // After add/remove_process_set: rank 0 may now coordinate a set it is not in, whose
  // requests only the loop thread can answer (Note [Caller drives] B).
  void processSetsChanged() { queue_.wakeIfAsleep(); }
  // Bounded: agrees shutdown with the other ranks or gives up after HVD_TIMEOUT.
  void shutdown();
  void abort(const std::string& reason);
  common::Status failure() const;
  // While a timeline file is written: NEGOTIATE_<OP> spans and per-tensor execution detail
  // (Note [Timeline detail] in executor.cc). Any thread.
  void setTimelineDetail(bool on);

 private:
  void run();
  int waitForWork(std::vector<int>* readable_controls);
  void pass(bool mark_cycle);
  bool idle() const;
  bool controlBacklog() const;
  void flushControl();
  void drainSubmissions();
  void readControl();
  void handleWorkerMessage(int from, const transport::ControlMessage& message);
  void handleCoordinatorMessage(const transport::ControlMessage& message);
  void coordinate();
  void sweepKeys();
  void sendReady();
  void sendRequests();
  void executeQueued();
  void applyParams(const coord::ParamsUpdate& update);
  void observeExecuted(const coord::Response& response, const common::Status& status);
  void inspectStalls();
  void failDeadlocked(std::chrono::steady_clock::time_point now);
  void beginShutdown();
  void checkShutdownAgreement();
  void fail(const common::Status& status, bool tell_peers);
  void completeAllPending(const common::Status& status, bool store_failure);
  struct CommSlot {
    std::unique_ptr<transport::Comm> comm;
    std::string transport;  // "SHM" / "TCP" (any TCP peer), for timeline activity names
  };
  // One unit of work in execution order: a response, or an autotune switch that takes effect
  // before the responses queued after it.
  struct Work {
    std::optional<coord::ParamsUpdate> params;
    coord::Response response;
  };

  CommSlot& commFor(int32_t process_set);
  void dropRemovedSets();
  timeline::Timeline* negotiationTimeline() const {
    return timeline_detail_.load(std::memory_order_relaxed) ? timeline_ : nullptr;
  }
  int timeoutMs() const;
  // Rank 0's window, as autotune set it; a worker's stays HVD_CYCLE_TIME_MS.
  double cycleTimeMs() const {
    return coordinator_ ? coordinator_->window().cycleTimeMs() : config_.cycle_time_ms;
  }
  bool coordinatesOtherSets() const {
    return coordinator_ && coordinator_->coordinatesOtherSets();
  }
  void awaitCause();

  transport::Mesh& mesh_;
  HandleTable& handles_;
  ProcessSetTable& sets_;
  Metrics& metrics_;
  const common::Config& config_;
  timeline::Timeline* timeline_;
  Autotuner* autotuner_;
  SubmissionQueue queue_;  // before executor_, whose device completions write its wakeFd()
  coord::KeyTable keys_;  // before executor_, which reads names from it
  uint32_t names_epoch_ = 0;  // handles_ holds keys_'s names under this attach
  Executor executor_;
  std::thread thread_;
  // Note [Caller drives]: held for every pass, by the loop thread or a driving caller.
  std::timed_mutex progress_;
  bool drivable_ = false;  // every peer is on shm: passes need no per-thread TCP helpers
  std::chrono::microseconds caller_spin_{0};
  // Note [Spin backoff] in caller_drives.cc: drives whose spin ran out in a row, and drives.
  std::atomic<int> spin_misses_{0};
  std::atomic<uint32_t> drives_{0};

  std::atomic<bool> timeline_detail_{false};  // any thread writes, the loop reads
  bool drained_recently_ = false;  // the last pass took submissions (guarded by progress_)

  // Background thread only.
  EntryTable entries_;
  std::vector<TensorEntry> draining_;          // submissions being drained (storage reused)
  std::vector<coord::Key> outgoing_;           // workers: requests not yet sent to rank 0
  std::vector<const coord::Request*> encoding_;
  std::deque<Work> to_execute_;
  bool waiting_for_device_ = false;  // its head is a staged CUDA op whose inputs are in transit
  uint64_t global_responses_ = 0;  // global-set responses executed (autotune switch points)
  std::map<int32_t, CommSlot> comms_;
  uint64_t comms_version_ = 0;  // sets_.version() comms_ was last pruned at
  bool failed_ = false;
  bool finished_ = false;
  bool shutdown_sent_ = false;
  std::chrono::steady_clock::time_point shutdown_deadline_;
  std::chrono::steady_clock::time_point last_stall_check_;
  std::chrono::steady_clock::time_point last_stall_report_;
  // Rank 0 only (null elsewhere): coordinator, batching window, shutdown votes.
  std::unique_ptr<RankZeroCoordinator> coordinator_;
  // Workers only.
  std::unique_ptr<coord::RequestCache> request_cache_;
};

}  // namespace hvd::runtime
