#include "runtime/background_loop.h"

#include <poll.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>

#include "common/logging.h"
#include "transport/shm/collective_segment.h"

namespace hvd::runtime {

using common::Status;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int kTickMs = 200;  // idle wake-up: liveness and stall checks, ~0% CPU

}  // namespace

BackgroundLoop::BackgroundLoop(transport::Mesh& mesh, HandleTable& handles,
                               ProcessSetTable& sets, Metrics& metrics,
                               const common::Config& config, timeline::Timeline* timeline,
                               Autotuner* autotuner)
    : mesh_(mesh), handles_(handles), sets_(sets), metrics_(metrics), config_(config),
      timeline_(timeline), autotuner_(autotuner),
      queue_(handles), executor_(handles, metrics, config, timeline, keys_, queue_.wakeFd()) {
  // Several peers may look lost by the time a collective notices; one of them may already have
  // sent the original cause (Note [Failure fan-out]), which then wins over this rank's guess.
  executor_.setFailureRefiner([this](const Status& status) {
    if (status.code() != common::Code::kPeerLost) return status;
    awaitCause();
    return failed_ ? failure() : status;
  });
  names_epoch_ = handles_.attachNames(&keys_);
  if (mesh_.rank() == 0) {
    coordinator_ = std::make_unique<RankZeroCoordinator>(mesh_.size(), keys_, sets_, config_,
                                                         autotuner_);
  } else {
    request_cache_ = std::make_unique<coord::RequestCache>(config_.cache_capacity);
  }
  std::vector<std::string> transports(mesh_.size());
  std::vector<std::string> controls(mesh_.size());
  drivable_ = true;
  for (int r = 0; r < mesh_.size(); ++r) {
    transport::Pair* pair = mesh_.pair(r);
    transports[r] = pair == nullptr ? "self"
                    : pair->kind() == transport::PairKind::kShm ? "shm" : "tcp";
    drivable_ = drivable_ && transports[r] != "tcp";
    const transport::ControlChannel* channel = mesh_.control(r);
    controls[r] = channel == nullptr ? "none" : channel->sharedMemory() ? "shm" : "tcp";
  }
  metrics_.setTransports(std::move(transports), std::move(controls));
  const transport::shm::CollectiveSegment* host = mesh_.collectiveSegment();
  if (host == nullptr) {
    metrics_.setHostCopy("none", "no host collective segment: one rank on this host, "
                                 "HVD_TRANSPORT=tcp, or the segment could not be made");
  } else if (host->singleCopy()) {
    metrics_.setHostCopy("single-copy", "");
  } else {
    metrics_.setHostCopy("segment", host->singleCopyReason());
  }
  if (host == nullptr) {
    metrics_.setSharedOutputs(false, "no host collective segment");
  } else {
    metrics_.setSharedOutputs(host->sharedOutputs(), host->sharedOutputs()
                                                         ? ""
                                                         : host->sharedOutputsReason());
  }
  // Where the host's ranks outnumber its cores the spin yields between passes (Note
  // [Yielding spins] in transport/mesh.cc).
  if (drivable_) caller_spin_ = std::chrono::microseconds(config_.caller_spin_microseconds);
  metrics_.setSpinYields(mesh_.spinYields());
  metrics_.setCallerSpin(caller_spin_.count());
  last_stall_check_ = Clock::now();
  last_stall_report_ = last_stall_check_;
}

BackgroundLoop::~BackgroundLoop() {
  if (thread_.joinable()) {
    shutdown();
  }
  handles_.detachNames(names_epoch_);  // before keys_ goes
}

void BackgroundLoop::start() { thread_ = std::thread([this] { run(); }); }

bool BackgroundLoop::idle() const {
  return entries_.empty() && to_execute_.empty() && outgoing_.empty() &&
         (!coordinator_ || coordinator_->idle()) && !executor_.deviceBusy() && !queue_.shutdownRequested() &&
         !queue_.abortRequested() && !controlBacklog();
}

// Frames a control ring had no room for yet (Note [Control over shm] C): the loop must watch
// its channels (no standby) until the peer has read them.
bool BackgroundLoop::controlBacklog() const {
  for (int r = 0; r < mesh_.size(); ++r) {
    const transport::ControlChannel* channel = mesh_.control(r);
    if (channel != nullptr && channel->hasBacklog()) return true;
  }
  return false;
}

// Before the channels close: what the rings could not take yet, bounded (a peer that stopped
// reading must not hold up this rank's exit).
void BackgroundLoop::flushControl() {
  for (int r = 0; r < mesh_.size(); ++r) {
    if (transport::ControlChannel* channel = mesh_.control(r)) channel->flushFor(1.0);
  }
}

void BackgroundLoop::setTimelineDetail(bool on) {
  timeline_detail_.store(on, std::memory_order_relaxed);
  executor_.setTimelineDetail(on);
  if (on) queue_.wakeIfAsleep();  // leave standby: NEGOTIATE spans need arrivals as they happen
}

Status BackgroundLoop::failure() const { return queue_.failure(); }

void BackgroundLoop::shutdown() {
  queue_.requestShutdown();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::timed_mutex> drained(progress_);  // a driving caller has left its pass
}

void BackgroundLoop::abort(const std::string& reason) {
  queue_.requestAbort(reason);
  mesh_.abort();  // ends any wait inside a collective at once
  queue_.wake();
}

void BackgroundLoop::run() {
  std::unique_lock<std::timed_mutex> lock(progress_, std::defer_lock);
  std::vector<int> readable_controls;
  while (true) {
    const int ready_listen_fd = waitForWork(&readable_controls);
    lock.lock();
    if (finished_) break;  // a driving caller may have finished the shutdown agreement
    // Under progress_: a driving caller's fail() may have closed the mesh meanwhile.
    if (transport::shm::Doorbell* bell = mesh_.controlDoorbell()) transport::shm::endSleep(bell);
    for (int r : readable_controls) {
      if (transport::ControlChannel* channel = mesh_.control(r)) channel->markSocketReadable();
    }
    if (ready_listen_fd >= 0 && !failed_ && ready_listen_fd == mesh_.listenFd()) {
      mesh_.acceptStray();
    }
    pass(/*mark_cycle=*/true);
    if (finished_) break;
    if (!idle() || coordinatesOtherSets()) queue_.setStandby(false);  // Note [Caller drives] B, C
    lock.unlock();
  }
  flushControl();
  mesh_.close();
}

void BackgroundLoop::pass(bool mark_cycle) {
  if (queue_.abortRequested() && !failed_) {
    const std::string reason = queue_.abortReason();
    fail(common::aborted("aborted on rank " + std::to_string(mesh_.rank()) +
                         (reason.empty() ? "" : ": " + reason)),
         /*tell_peers=*/true);
  }
  // only while a file marks cycles; a spinning caller's passes are not cycles
  if (mark_cycle && timeline_ != nullptr) timeline_->markCycle();
  if (coordinator_ && !failed_) {
    // Before anything is admitted: requests are admitted (and fused) as they arrive, so a new
    // autotune setting must be in force first (coordinate(), step b).
    coordinator_->syncProcessSets();
    coordinator_->adoptTunedParams();
  }
  drainSubmissions();
  if (!failed_) readControl();
  if (!failed_ && !shutdown_sent_) {
    int lost = mesh_.findLostPeer();
    if (lost >= 0 && !to_execute_.empty()) {
      // Responses already here were agreed by every rank, and the peer may have left after
      // completing them and agreeing to shut down: run them before judging it.
      executeQueued();
      lost = failed_ ? -1 : mesh_.findLostPeer();
    }
    if (lost >= 0) awaitCause();  // Note [Failure fan-out]
    if (lost >= 0 && !failed_) {
      fail(common::peerLost("lost connection to rank " + std::to_string(lost) +
                            ": the process exited or closed the connection"),
           true);
    }
  }
  if (queue_.shutdownRequested() && !shutdown_sent_) beginShutdown();
  if (!failed_ && !shutdown_sent_) {
    if (mesh_.rank() == 0) coordinate(); else sendRequests();
    executeQueued();
    inspectStalls();
  }
  if (!failed_) {  // device ops queued earlier may finish while the shutdown is agreed
    Status device = executor_.pollDevice();
    if (!device.isOk()) fail(device, /*tell_peers=*/true);
  }
  if (shutdown_sent_) checkShutdownAgreement();
  if (keys_.wantsSweep()) sweepKeys();
}

// Builds the poll set under progress_ (it reads pass state), sleeps without it. Returns the
// listening socket when it has a connection to accept (-1 otherwise): run() accepts it under
// progress_, after checking that a driving caller did not close the mesh meanwhile. Fills
// *readable_controls with the ranks whose control socket polled readable, for run() to mark
// (and to end the control doorbell's poll sleep) under progress_ likewise.
int BackgroundLoop::waitForWork(std::vector<int>* readable_controls) {
  std::vector<pollfd> fds;
  std::vector<int> control_ranks;  // of fds[control_begin ...]
  fds.push_back({queue_.wakeFd(), POLLIN, 0});
  int64_t timeout_us = int64_t{kTickMs} * 1000;
  int64_t nap_us = 0;  // > 0: nap instead of sleep (Note [Coalesced wakes])
  size_t listen_index = 0;  // 0: not polled
  size_t control_begin = 0;
  bool control_waiting = false;  // a frame sits in a control ring already
  readable_controls->clear();
  {
    std::lock_guard<std::timed_mutex> lock(progress_);
    if (!failed_ && !queue_.standby()) {  // Note [Caller drives] B
      if (mesh_.listenFd() >= 0) {
        listen_index = fds.size();
        fds.push_back({mesh_.listenFd(), POLLIN, 0});
      }
      // Note [Control over shm] B: announce, then re-check the rings, before the poll.
      if (transport::shm::Doorbell* bell = mesh_.controlDoorbell()) {
        transport::shm::beginPollSleep(bell);
      }
      control_begin = fds.size();
      for (int r = 0; r < mesh_.size(); ++r) {
        transport::ControlChannel* channel = mesh_.control(r);
        if (channel == nullptr) continue;
        fds.push_back({channel->fd(), POLLIN, 0});
        control_ranks.push_back(r);
        control_waiting = control_waiting || channel->hasIncoming();
        // Note [Control over shm] C: a reader that made room before the announcement woke
        // nobody. Flushing after it either moves bytes (go on at once) or leaves a fresh mark,
        // which the reader answers with a wake byte now that the sleep is announced.
        if (channel->hasBacklog() && channel->flush()) control_waiting = true;
      }
    }
    timeout_us = int64_t{timeoutMs()} * 1000;
    const double cycle_time_ms = cycleTimeMs();
    if (cycle_time_ms > 0 && !failed_ && drained_recently_ && !idle()) {
      nap_us = std::max<int64_t>(1, static_cast<int64_t>(cycle_time_ms * 1000));
    }
  }
  auto t0 = Clock::now();
  // Notes [Coalesced wakes] (a nap) and [Wake only a sleeper] (a sleep).
  timeout_us = queue_.beginSleep(timeout_us, nap_us);
  if (control_waiting) timeout_us = 0;
  const timespec ts{static_cast<time_t>(timeout_us / 1000000),
                    static_cast<long>(timeout_us % 1000000) * 1000};
  int rc = ::ppoll(fds.data(), fds.size(), &ts, nullptr);
  queue_.endSleep();
  metrics_.addWait(std::chrono::duration<double>(Clock::now() - t0).count());
  if (rc <= 0) return -1;
  for (size_t i = 0; i < control_ranks.size(); ++i) {
    if (fds[control_begin + i].revents != 0) readable_controls->push_back(control_ranks[i]);
  }
  if (fds[0].revents & POLLIN) queue_.consumeWake();
  return listen_index > 0 && (fds[listen_index].revents & POLLIN) ? fds[listen_index].fd : -1;
}

// Zero while work is queued (unless it waits for the device, which wakes the loop); until the
// batching window closes while rank 0 holds responses (rounded up: the window may end up to a
// millisecond late, never early); else the idle tick.
int BackgroundLoop::timeoutMs() const {
  if (!to_execute_.empty() && !waiting_for_device_) return 0;
  if (!coordinator_ || coordinator_->window().empty()) return kTickMs;
  const auto left = coordinator_->window().end() - Clock::now();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(left).count();
  return us <= 0 ? 0 : static_cast<int>(std::min<int64_t>((us + 999) / 1000, kTickMs));
}

// A worker that sees a peer hang up may be early: the peer may have closed on a cause rank 0
// is relaying to every worker (an abort, a timeout), and rank 0's message to this rank can
// trail the peer's close. Give it a short, bounded chance to arrive (Note [Failure fan-out]).
void BackgroundLoop::awaitCause() {
  constexpr double kCauseWaitSeconds = 0.1;
  transport::ControlChannel* channel = mesh_.rank() == 0 ? nullptr : mesh_.control(0);
  // Rank 0's ring may already hold other frames (responses of ops running now): read them and
  // keep waiting, until the cause comes (fail() sets failed_) or the time is up.
  const auto deadline = transport::tcp::deadlineAfter(kCauseWaitSeconds);
  for (int left_ms = 1; channel != nullptr && !failed_ && left_ms > 0;) {
    left_ms = transport::tcp::millisecondsLeft(deadline, 1000);
    if (left_ms > 0) channel->waitReadable(left_ms);
    readControl();
  }
  if (channel == nullptr) readControl();
}

// Every op of this rank — submitted, drained or queued for execution — ends with `status`, and
// its name is free again whether or not its handle was released (Note [Name lifetime]).
// store_failure: later submissions fail with it too.
void BackgroundLoop::completeAllPending(const Status& status, bool store_failure) {
  executor_.failDevice(status);  // aborts the NCCL communicators a lost peer may hold up
  queue_.failAll(status, store_failure);
  entries_.forEach([&](TensorEntry& entry) { handles_.complete(entry.handle, status); });
  entries_.clear();
  keys_.releaseAll();
  to_execute_.clear();
  if (coordinator_) coordinator_->dropBatch();
}

void BackgroundLoop::fail(const Status& status, bool tell_peers) {
  if (failed_) return;
  failed_ = true;
  HVD_LOG(kWarning, "runtime") << "core failed: " << status.message();
  // Note [Failure fan-out]: the reason travels to every rank (kAbort with the status code,
  // relayed by rank 0), so a survivor reports the real cause — e.g. the rank that died — not
  // the rank that told it. A lost peer is also seen by every survivor on its own connection
  // (the mesh is complete), so for that cause this rank keeps its sockets open: closing them
  // would make slower survivors blame a live rank. Other causes (abort, timeout, malformed
  // input) are invisible to peers, so the connections are closed as well.
  if (tell_peers) {
    std::string payload(1, static_cast<char>(status.code()));
    payload += status.message();
    for (int r = 0; r < mesh_.size(); ++r) {
      transport::ControlChannel* channel = mesh_.control(r);
      if (channel != nullptr) {
        channel->send(static_cast<uint32_t>(coord::MessageType::kAbort), payload, 1.0);
      }
    }
  }
  completeAllPending(status, /*store_failure=*/true);
  metrics_.setLastError(status.message());
  if (tell_peers) flushControl();
  if (status.code() != common::Code::kPeerLost) mesh_.close();
  if (queue_.shutdownRequested()) finished_ = true;
}

}  // namespace hvd::runtime
