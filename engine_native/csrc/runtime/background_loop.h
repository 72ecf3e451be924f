// BackgroundLoop: the one progress loop per process that owns all communication. Framework
// threads submit() entries and get woken through handles; the loop reads like a table of
// contents: wait for work -> drain submissions -> negotiate (workers send requests to rank 0,
// rank 0 coordinates and sends responses) -> execute responses in order -> complete the CUDA
// ops whose stream work has run (Note [Deferred completion]) -> inspect stalls.
// A pass of that loop may also run on a framework thread that is about to block on its own op
// (drive(), Note [Caller drives] in background_loop.cc): passes are serialised by progress_,
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
//
// State by owner (the loop itself keeps orchestration: the pass, failure, shutdown):
//   SubmissionQueue (submission_queue.h)      framework threads <-> loop: submissions, the
//                                             sticky failure, shutdown/abort, wake protocol
//   RankZeroCoordinator (rank_zero_coordinator.h)  rank 0 only: coordinator, mirrors, parked
//                                             requests, per-name state, shutdown votes, with
//     BatchingWindow (batching_window.h)      the held batch and step memory
//   WorkerRequests (worker_requests.h)        workers only: requests not yet sent, their cache
//   ExecutionQueue (execution_queue.h)        agreed work in order, per-set connections
//   StallInspector (stall_inspector.h)        pending tensors, stall warnings, deadlocks
//   DrivePolicy (drive_policy.h)              whether and how long callers drive
// Methods: background_loop.cc (threads: construction, run/wait, shutdown agreement, drive)
// and loop_pass.cc (one pass and its steps, failure, key sweep).
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "common/config.h"
#include "coord/key_table.h"
#include "coord/validation.h"
#include "runtime/autotuner.h"
#include "runtime/core_headroom.h"
#include "runtime/cpu_binding.h"
#include "runtime/drive_policy.h"
#include "runtime/execution_queue.h"
#include "runtime/executor.h"
#include "runtime/handle_table.h"
#include "runtime/metrics.h"
#include "runtime/one_round.h"
#include "runtime/peer_ops.h"
#include "runtime/process_sets.h"
#include "runtime/rank_zero_coordinator.h"
#include "runtime/stall_inspector.h"
#include "runtime/submission_queue.h"
#include "runtime/tensor_entry.h"
#include "runtime/worker_requests.h"
#include "timeline/timeline.h"
#include "transport/mesh.h"

namespace hvd::runtime {

class BackgroundLoop {
  using Clock = std::chrono::steady_clock;

 public:
  // `timeline` and `autotuner` may be null; both outlive the loop.
  BackgroundLoop(transport::Mesh& mesh, HandleTable& handles, ProcessSetTable& sets,
                 Metrics& metrics, const common::Config& config, timeline::Timeline* timeline,
                 Autotuner* autotuner, const CpuBinding& binding);
  ~BackgroundLoop();

  void start();
  // Framework threads. Takes the entries (all or none: a duplicate name fails the call) and
  // fills in their keys and handles; each handle holds its name until the user has seen the
  // op finish (Note [Name lifetime] in handle_table.h). Fails at once with the stored failure
  // when the core has failed.
  // wake=false: the caller waits for these entries at once and drive()s them itself (where
  // callers can drive at all: Note [Caller drives] D; elsewhere the loop is woken anyway).
  common::Status submit(TensorEntry* entries, const std::string_view* names, size_t count,
                        bool wake = true) {
    const bool drive = !wake && drive_.drives(entryBytes(entries, count));  // Note D
    return queue_.submit(entries, names, count, /*caller_waits=*/drive, /*wake=*/!drive);
  }
  // Point-to-point sends and receives (peer_ops.h); framework threads. wait_now as submit()'s
  // !wake: the caller blocks on the handle at once and drive()s it.
  // Where callers can drive, an async send is written, and an async receive posted, by the
  // caller at once when the loop is free, and a later wait on either drives it (Note [Caller
  // drives] H).
  common::Status submitSend(PeerSend send, bool wait_now, int64_t* handle);
  common::Status submitRecv(const PeerRecv& recv, bool wait_now, int64_t* handle);
  const char* peerCudaRoute(int peer) const { return peer_ops_.cudaRoute(peer); }
  // Framework threads about to block on `handle`: run passes on this thread for up to
  // HVD_CALLER_SPIN_US (one pass when spinning would steal a core). True when the handle
  // finished here; false means the caller must block on it (the loop thread took over).
  bool drive(int64_t handle);
  // Framework threads, after drive(), blocked on `handle`: while its CUDA op's completion is
  // the caller's to poll (Note [Caller waits on the device] in device_executor.cc), polls the
  // device for up to `slice` or until the op is done, and returns true; false at once when it
  // is not (the caller blocks on its handle). since: when the caller began to wait (paces the
  // polls across slices).
  bool awaitDevice(int64_t handle, std::chrono::milliseconds slice, Clock::time_point since);
  // Framework threads, after drive(), blocked on a point-to-point `handle`: sleeps on the peer
  // doorbell and reads what wakes it itself, for up to `slice` or until the op is done, and
  // returns true; false at once where it cannot (the caller blocks on its handle). Note
  // [Caller sleeps on the doorbell] in peer_await.cc.
  bool awaitPeer(int64_t handle, std::chrono::milliseconds slice);
  // H: one point-to-point pass on this thread if no pass is running; wakes the loop unless
  // the pass ran (a send not written by it is left to the loop thread).
  void progressEagerly(int64_t handle, bool is_send);
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
  // background_loop.cc
  void run();
  // Sets *idle_tick when the wait ran out its whole idle tick (Note [Tick pickups]).
  int waitForWork(std::vector<int>* readable_controls, std::vector<int>* readable_peers,
                  bool* idle_tick);
  void parkWhileCallersDrive();  // Note [Caller drives] D (loop_sleep.cc)
  int timeoutMs() const;
  bool idle() const;
  bool collectivesIdle() const;  // idle() but for point-to-point
  bool controlBacklog() const;
  void flushControl();
  void beginShutdown();
  void checkShutdownAgreement();
  // loop_pass.cc
  // True when the pass took a submission or received a control message. by_loop_thread: the
  // loop thread's pass (it marks timeline cycles and always checks for lost peers), not a
  // driving caller's.
  bool pass(bool by_loop_thread);
  bool drainSubmissions();
  bool lostPeerCheckDue(bool loop_thread);  // Note [Lost peer checks]
  void negotiate(coord::Key key);  // hands a drained op to rank 0's negotiation
  void stepOneRound();
  void connectBoardFrames();  // Note [One round] K, at construction
  void awaitBoardPosts();     // ... and at a failure
  OneRound::Run runOneRound();  // a board op runs through the Executor, outside the queue
  bool readControl();
  void progressPeerOps(bool* took_work, bool in_pass = false);
  void peerOpsFailed(const common::Status& status);  // point-to-point's error, as a pass's
  void handleWorkerMessage(int from, const transport::ControlMessage& message);
  void handleCoordinatorMessage(const transport::ControlMessage& message);
  void noteClosedWhileShuttingDown(int rank);  // rank 0: relays why to ranks still running
  void coordinate();
  // Note [Batching window], the blocked caller: a caller of rank 0 is in wait() and every
  // tensor rank 0 has in flight is in the held batch (rank 0 only).
  bool ownBlocked() const;
  void sendReady();
  void sendRequests();
  void executeQueued();
  // Note [Failure fan-out]: rank 0's relayed cause of a hang-up this rank saw (`seen`).
  void awaitCause(const common::Status& seen);
  common::Status lostConnection(int rank) const;  // kPeerLost: rank `rank` hung up
  // A kTimeout with the stopped ranks of this machine named (stopped_ranks.h); else `status`.
  common::Status withStoppedRanks(const common::Status& status) const;
  // This rank's abort() as the failure to report: "aborted on rank R: <reason>".
  common::Status abortedHere() const;
  void fail(const common::Status& cause, bool tell_peers);
  // kAbort on the control channels (loop_pass.cc)
  void sendAbort(const common::Status& status, int except = -1, bool running_only = false);
  void completeAllPending(const common::Status& status, bool store_failure);
  void sweepKeys();

  timeline::Timeline* negotiationTimeline() const {
    return timeline_detail_.load(std::memory_order_relaxed) ? timeline_ : nullptr;
  }
  // Rank 0's window, as autotune set it; a worker's stays HVD_CYCLE_TIME_MS.
  double cycleTimeMs() const {
    return coordinator_ ? coordinator_->window().cycleTimeMs() : config_.cycle_time_ms;
  }
  bool coordinatesOtherSets() const {
    return coordinator_ && coordinator_->coordinatesOtherSets();
  }

  // Set at construction, outlive the loop.
  transport::Mesh& mesh_;
  // Read by framework threads outside progress_, where the mesh may be gone once the loop
  // shut down (a caller that took the loop just before Runtime::shutdown).
  const bool rank_zero_;
  const bool spin_yields_;
  HandleTable& handles_;
  ProcessSetTable& sets_;
  Metrics& metrics_;
  const common::Config& config_;
  timeline::Timeline* timeline_;
  coord::KeyTable keys_;  // thread-safe; before queue_ and executor_, which use it
  // Any thread (its own lock and atomics); before executor_, whose device completions write
  // its wakeFd().
  SubmissionQueue queue_;
  PeerOps peer_ops_;  // framework threads submit (its own lock); passes run the rest
  uint32_t names_epoch_ = 0;  // handles_ holds keys_'s names under this attach
  Executor executor_;
  std::thread thread_;
  // Note [Caller drives]: held for every pass, by the loop thread or a driving caller.
  std::timed_mutex progress_;
  DrivePolicy drive_;  // configured before start(); then read by framework threads
  DrivePolicy peer_drive_;  // point-to-point waits' own spin record (Note [Caller drives] H)
  // Note [Spin while a core is free] in core_headroom.cc: how long past its budget a
  // point-to-point wait may spin (zero unless the ranks are bound to CPUs of their own), and
  // the check that allows it.
  std::chrono::microseconds peer_spin_cap_{0};
  CoreHeadroom headroom_;
  std::atomic<bool> peer_sleeper_{false};  // a caller is in awaitPeer (one at a time)
  // Under progress_: the loop thread's latest sleep watches control channels and sockets (it
  // began out of standby, not failed). Note [Caller drives] I.
  bool watches_all_ = false;
  // A caller asleep on the mutex wakes this often to see whether the loop thread finished its
  // op meanwhile (a long pass may hold the mutex for the whole budget).
  static constexpr auto kLockSlice = std::chrono::microseconds(50);
  std::atomic<bool> timeline_detail_{false};  // written by any thread, read by passes

  // Guarded by progress_ (the background thread: the loop thread or a driving caller).
  bool drained_recently_ = false;  // the last pass took submissions (Note [Coalesced wakes])
  EntryTable entries_;             // drained, not yet completed
  std::vector<TensorEntry> draining_;  // submissions being drained (storage reused)
  ExecutionQueue execution_;       // after executor_ and entries_, which it uses
  StallInspector stalls_;
  OneRound one_round_;  // the global set's small blocking ops on one host (Note [One round])
  bool failed_ = false;
  bool finished_ = false;
  bool shutdown_sent_ = false;
  Clock::time_point shutdown_deadline_;
  std::set<int> closed_in_shutdown_;  // rank 0: workers whose channel ended while it shut down
  Clock::time_point last_lost_peer_check_{};
  static constexpr auto kLostPeerCheckEvery = std::chrono::milliseconds(1);
  static constexpr auto kBoardPostsWait = std::chrono::seconds(1);  // awaitBoardPosts
  static constexpr uint64_t kTcpDriveMaxBytes = 1 << 20;  // Note [Caller drives] D
  static constexpr int kTickMs = 200;  // idle wake-up: liveness and stall checks, ~0% CPU
  static constexpr auto kStandbyPark = std::chrono::microseconds(20'000);  // D's park quantum
  std::atomic<bool> caller_driving_{false};  // a caller holds progress_ in drive() (D's park)
  std::atomic<uint64_t> drives_started_{0};   // D's park: callers still driving
  static uint64_t entryBytes(const TensorEntry* entries, size_t count) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < count; ++i) bytes += coord::requestBytes(entries[i].request);
    return bytes;
  }
  std::unique_ptr<RankZeroCoordinator> coordinator_;  // rank 0 only (null elsewhere)
  std::unique_ptr<WorkerRequests> requests_;          // workers only (null on rank 0)
};

}  // namespace hvd::runtime
