// One pass of BackgroundLoop (background_loop.h), run by the loop thread or by a caller that
// drives (Note [Caller drives] in background_loop.cc), and its steps in order: drain
// submissions, read control messages, negotiate (rank 0 coordinates and sends responses,
// workers send requests), execute, inspect stalls; then failure (Note [Failure fan-out]) and
// the sweep of keys nothing refers to any more.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "common/coarse_clock.h"
#include "common/logging.h"
#include "common/test_switch.h"
#include "runtime/background_loop.h"
#include "runtime/stopped_ranks.h"
#include "transport/tcp/socket.h"

namespace hvd::runtime {

using common::Status;
using coord::MessageType;
using Clock = std::chrono::steady_clock;

namespace {

// A kAbort payload is the failing rank's status code (one byte) followed by its message
// (Note [Failure fan-out]); anything else reads as a plain abort. A peer's own mistake (a
// ValueError there) is an abort here: this rank did nothing wrong.
Status statusFromAbort(const std::string& payload) {
  if (!payload.empty()) {
    auto code = static_cast<common::Code>(static_cast<unsigned char>(payload[0]));
    if (code == common::Code::kPeerLost || code == common::Code::kTimeout ||
        code == common::Code::kAborted || code == common::Code::kInternal) {
      return Status(code, payload.substr(1));
    }
    if (code == common::Code::kInvalidArgument || code == common::Code::kTypeError ||
        code == common::Code::kMismatch) {
      return common::aborted(payload.substr(1));
    }
  }
  return common::aborted(payload);
}

// Test switch: HVD_TEST_FAILURE_NOTICE_DELAY_MS=N (set on one rank): it waits N ms before it
// tells its peers of a failure, as a rank 0 descheduled on a loaded host relays late.
void delayFailureNoticeForTests() {
  if (const char* raw = HVD_TEST_SWITCH("FAILURE_NOTICE_DELAY_MS")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(raw)));
  }
}

}  // namespace

bool BackgroundLoop::pass(bool by_loop_thread) {
  if (queue_.abortRequested() && !failed_) fail(abortedHere(), /*tell_peers=*/true);
  // only while a file marks cycles; a spinning caller's passes are not cycles
  if (by_loop_thread && timeline_ != nullptr) timeline_->markCycle();
  if (coordinator_ && !failed_) {
    // Before anything is admitted: requests are admitted (and fused) as they arrive, so a new
    // autotune setting must be in force first (coordinate(), step b).
    coordinator_->syncProcessSets();
    coordinator_->adoptTunedParams();
  }
  bool took_work = drainSubmissions();
  if (!failed_ && readControl()) took_work = true;
  if (!failed_ && !shutdown_sent_) stepOneRound();
  if (!failed_ && !shutdown_sent_ && lostPeerCheckDue(by_loop_thread)) {
    int lost = mesh_.findLostPeer();
    if (lost >= 0 && !execution_.empty()) {
      // Responses already here were agreed by every rank, and the peer may have left after
      // completing them and agreeing to shut down: run them before judging it.
      executeQueued();
      lost = failed_ ? -1 : mesh_.findLostPeer();
    }
    if (lost >= 0) {
      const Status hung_up = lostConnection(lost);
      awaitCause(hung_up);  // Note [Failure fan-out]
      if (!failed_) fail(hung_up, true);
    }
  }
  if (!failed_ && !finished_) progressPeerOps(&took_work, true);  // also shutting down (F)
  if (queue_.shutdownRequested() && !shutdown_sent_) beginShutdown();
  if (!failed_ && !shutdown_sent_) {
    if (mesh_.rank() == 0) coordinate(); else sendRequests();
    executeQueued();
    stalls_.inspect(entries_, coordinator_.get(), peer_ops_, one_round_);
  } else if (!failed_ && !finished_ && mesh_.rank() == 0) {
    coordinate();  // for the ranks still running (see the shutdown agreement's comment)
  }
  if (!failed_) {  // device ops queued earlier may finish while the shutdown is agreed
    Status device = executor_.pollDevice();
    if (!device.isOk()) fail(device, /*tell_peers=*/true);
  }
  if (shutdown_sent_) checkShutdownAgreement();
  if (keys_.wantsSweep()) sweepKeys();
  return took_work;
}

// Note [Lost peer checks]
// A pass asks the kernel whether a peer's data connection hung up (one poll() over them, ~1 us
// of system call). The loop thread's passes always ask: it may have woken for that hang-up. A
// caller's spinning passes ask at most once per kLostPeerCheckEvery (read on the coarse clock,
// so up to a tick later): in a small op's wait the syscall was most of each pass, so it
// delayed seeing the peer's post by up to its own length, while a peer lost mid-spin is still
// seen within a few milliseconds (or sooner by the control channel's own end-of-stream, or by
// the collective's own wait).
bool BackgroundLoop::lostPeerCheckDue(bool loop_thread) {
  const auto now = common::coarseSteadyNow();
  if (!loop_thread && now - last_lost_peer_check_ < kLostPeerCheckEvery) return false;
  last_lost_peer_check_ = now;
  return true;
}

// Note [Point-to-point] D in peer_ops.cc: a connection lost or malformed fails the rank; a lost
// peer is reported with its original cause where one comes (Note [Failure fan-out]). While the
// rank shuts down (F) an error ends point-to-point only: the rank is leaving anyway.
void BackgroundLoop::progressPeerOps(bool* took_work, bool in_pass) {
  bool moved = false;
  peer_ops_.setBoardWaiting(one_round_.awaitsFrames());  // Note [One round] K
  const Status s = peer_ops_.progress(&moved);
  if (moved) *took_work = true;
  if (!s.isOk()) peerOpsFailed(s);
  // Board frames arrived (Note [One round] K): a pass finishes the round now; a
  // point-to-point caller (Note [Caller drives] H: no collective inside an isend) wakes the
  // loop thread for it instead, which may sleep in a poll the caller's read emptied.
  if (!one_round_.takeFresh() || failed_ || shutdown_sent_) return;
  if (in_pass) stepOneRound(); else queue_.wakeIfAsleep();
}

void BackgroundLoop::peerOpsFailed(const Status& s) {
  if (shutdown_sent_) {
    HVD_LOG(kWarning, "runtime") << "shutdown: point-to-point stopped: " << s.message();
    peer_ops_.failAll(s);
    return;
  }
  if (s.code() == common::Code::kPeerLost) awaitCause(s);
  if (!failed_) fail(s, /*tell_peers=*/true);
}

bool BackgroundLoop::drainSubmissions() {
  queue_.take(&draining_);  // clears the pending flags (Note [Coalesced wakes])
  drained_recently_ = !draining_.empty();  // Note [Coalesced wakes]
  if (draining_.empty()) return false;
  timeline::Timeline* timeline = coordinator_ ? negotiationTimeline() : nullptr;
  timeline::ClockScope one_clock_read(timeline);  // these arrivals are processed together
  const auto now = Clock::now();
  for (auto& e : draining_) {
    e.enqueued = now;  // for the stall inspector's ages: one clock read per drain
    if (failed_) {
      handles_.complete(e.handle, failure());
      keys_.release(&e.request.key, 1);
      continue;
    }
    if (e.request.type == coord::OpType::kJoin && e.request.device >= 0) {
      executor_.noteJoinDevice(e.request.device);
    }
    TensorEntry& entry = entries_.put(std::move(e));
    if (one_round_.active() && entry.request.process_set == 0) {
      one_round_.take(entry.request.key);  // stepOneRound posts it or sends it on
    } else if (coordinator_) {
      coordinator_->admit(entry.request.key, entry.request, mesh_.rank(), timeline, now);
    } else {
      requests_->add(entry.request.key);
    }
  }
  draining_.clear();
  metrics_.setQueueDepth(entries_.size());
  return true;
}

void BackgroundLoop::negotiate(coord::Key key) {
  const TensorEntry* entry = entries_.find(key);
  if (entry == nullptr) return;
  if (coordinator_) {
    timeline::Timeline* timeline = negotiationTimeline();
    coordinator_->admit(key, entry->request, mesh_.rank(), timeline, Clock::now());
  } else {
    requests_->add(key);
  }
}

OneRound::Run BackgroundLoop::runOneRound() {
  return [this](const coord::Response& r, const OneRoundInputs& inputs) {
    return execution_.runOneRound(r, inputs);
  };
}

// Note [One round] K: the board's frames to and from ranks off this host's segment.
void BackgroundLoop::connectBoardFrames() {
  one_round_.setSender(
      [this](int peer, transport::PeerFrameKind kind, int64_t tag, std::string bytes) {
        peer_ops_.sendBoard(peer, kind, tag, std::move(bytes));
      });
  peer_ops_.setBoardSink([this](int peer, const transport::PeerMessage& message) {
    return one_round_.arrived(peer, message);
  });
}

// Note [One round] in one_round.cc: before negotiation in the pass, so what the board sends
// on goes to rank 0 in this pass's request list.
void BackgroundLoop::stepOneRound() {
  const Status status =
      one_round_.step(entries_, [this](coord::Key key) { negotiate(key); }, runOneRound(),
                      coordinator_ ? negotiationTimeline() : nullptr);
  if (!status.isOk() && !failed_) fail(status, /*tell_peers=*/true);
}

bool BackgroundLoop::readControl() {
  bool received = false;
  for (int r = 0; r < mesh_.size() && !failed_ && !finished_; ++r) {
    transport::ControlChannel* channel = mesh_.control(r);
    if (channel == nullptr) continue;
    channel->flush();  // Note [Control over shm] C
    std::vector<transport::ControlMessage> messages;
    Status status = channel->receive(&messages);
    received = received || !messages.empty();
    for (const auto& m : messages) {
      if (mesh_.rank() == 0) handleWorkerMessage(r, m); else handleCoordinatorMessage(m);
      if (failed_ || finished_) return true;
    }
    if (status.isOk()) continue;
    if (shutdown_sent_) {
      // A peer that already agreed to shut down may close first.
      if (mesh_.rank() == 0) noteClosedWhileShuttingDown(r); else finished_ = true;
      continue;
    }
    if (status.code() == common::Code::kPeerLost) {
      fail(lostConnection(r), true);
    } else {
      fail(status, true);
    }
  }
  return received;
}

void BackgroundLoop::handleCoordinatorMessage(const transport::ControlMessage& message) {
  switch (static_cast<MessageType>(message.type)) {
    case MessageType::kResponses: {
      coord::ResponseList list;
      Status status = coord::decode(message.payload, keys_, &list);
      if (!status.isOk()) {
        fail(common::internalError("malformed response list from rank 0: " + status.message()),
             false);
        return;
      }
      // The switch precedes this list's responses (Rule in coord/message.h, ParamsUpdate).
      if (list.params) execution_.pushParams(*list.params);
      for (auto& r : list.responses) execution_.push(std::move(r));
      break;
    }
    case MessageType::kShutdown:  // every rank agreed (checkShutdownAgreement)
      finished_ = true;
      break;
    case MessageType::kAbort:
      if (shutdown_sent_) {  // another rank failed meanwhile: not this rank's failure
        HVD_LOG(kInfo, "runtime") << "shutdown: ends on another rank's failure: "
                                  << statusFromAbort(message.payload).message();
        finished_ = true;
        break;
      }
      fail(statusFromAbort(message.payload), false);
      break;
    default:
      HVD_LOG(kWarning, "coord") << "ignoring control message of unknown type " << message.type;
  }
}

// Requests are admitted as they are decoded: a repeated one comes from the mirror with its
// key hint, so the steady state interns nothing.
void BackgroundLoop::handleWorkerMessage(int from, const transport::ControlMessage& message) {
  switch (static_cast<MessageType>(message.type)) {
    case MessageType::kRequests: {
      timeline::Timeline* timeline = negotiationTimeline();
      timeline::ClockScope one_clock_read(timeline);  // these arrivals are processed together
      const auto now = Clock::now();
      Status status = coordinator_->admitRequests(from, message.payload, timeline, now);
      if (!status.isOk()) {
        fail(common::internalError("malformed request list from rank " + std::to_string(from) +
                                   ": " + status.message()), true);
        return;
      }
      break;
    }
    case MessageType::kShutdown:
      coordinator_->noteShutdown(from);
      break;
    case MessageType::kAbort:
      fail(statusFromAbort(message.payload), /*tell_peers=*/true);
      break;
    default:
      HVD_LOG(kWarning, "coord") << "ignoring control message of unknown type " << message.type
                                 << " from rank " << from;
  }
}

// The coordinator step, in order (requests were admitted as they arrived: drain and
// readControl call RankZeroCoordinator::admit(); only those for sets not registered yet wait
// in its parked list):
//   a. admit parked requests whose set is registered now;
//   b. (at the start of the pass, before any admission: a new autotune setting — rank 0's
//      fusion threshold, window and cache — is adopted, so the responses released in this
//      pass are fused under it and carry it);
//   c. release what is ready (timeline: NEGOTIATE_<OP> closes) into the batching window;
//   d. keep holding while the batching window is open (BatchingWindow::hold), else send the
//      batch.
void BackgroundLoop::coordinate() {
  auto t0 = Clock::now();
  timeline::Timeline* timeline = negotiationTimeline();
  coordinator_->admitParked(timeline);
  coordinator_->release(t0, timeline);
  if (coordinator_->sendNow(ownBlocked())) sendReady();
  metrics_.addNegotiate(std::chrono::duration<double>(Clock::now() - t0).count());
}

// Counted against the held batch's own keys: after rank 0 joined, the batch also names
// tensors it never submitted.
bool BackgroundLoop::ownBlocked() const {
  if (!handles_.callerInWait() || !execution_.empty() || queue_.submissionsPending() ||
      entries_.empty() || coordinator_->window().empty()) {
    return false;
  }
  size_t held = 0;
  for (const auto& r : coordinator_->window().responses()) {
    for (coord::Key key : r.keys) held += entries_.contains(key) ? 1 : 0;
  }
  return held == entries_.size();
}

// Step A: send each worker its share (responses of sets it belongs to), in order, with the
// pending autotune setting (also to workers whose share is empty). Step B: queue rank 0's own
// share the same way. Once rank 0 is shutting down (the shutdown agreement's comment in
// background_loop.cc): no share for ranks that shut down (they may have closed), and none
// queued here (nothing executes them any more: a queue that never empties would make the loop
// poll without sleeping).
void BackgroundLoop::sendReady() {
  std::optional<coord::ParamsUpdate> params;
  std::vector<coord::Response> ready = coordinator_->takeBatch(&params);
  std::vector<const coord::Response*> share;
  for (int w = 1; w < mesh_.size(); ++w) {
    if (shutdown_sent_ && coordinator_->hasShutDown(w)) continue;
    share.clear();
    for (const auto& r : ready) {
      if (sets_.contains(r.process_set, w)) share.push_back(&r);
    }
    if (share.empty() && !params) continue;
    Status status = mesh_.control(w)->send(static_cast<uint32_t>(MessageType::kResponses),
                                           coord::encode(share.data(), share.size(), params,
                                                         keys_),
                                           config_.timeout_seconds);
    if (!status.isOk()) {
      fail(common::peerLost("lost connection to rank " + std::to_string(w) + ": " +
                            status.message()), true);
      return;
    }
  }
  if (shutdown_sent_) return;
  if (params) execution_.pushParams(*params);
  for (auto& r : ready) execution_.push(std::move(r));
}

void BackgroundLoop::sendRequests() {
  if (requests_->empty()) return;
  std::string bytes = requests_->encode(entries_);
  Status status = mesh_.control(0)->send(static_cast<uint32_t>(MessageType::kRequests), bytes,
                                         config_.timeout_seconds);
  if (!status.isOk()) {
    fail(common::peerLost("lost connection to rank 0: " + status.message()), true);
  }
}

void BackgroundLoop::executeQueued() {
  Status status = execution_.run();
  if (status.isOk() && !failed_) {  // Note [One round] J: before the joined callers' next ops
    status = one_round_.reopenAfterJoin(execution_.globalJoins(), entries_,
                                        [this](coord::Key key) { negotiate(key); },
                                        runOneRound());
  }
  // A peer lost mid-op (e.g. during NCCL set-up) may have sent its cause (Note [Failure
  // fan-out]).
  if (status.code() == common::Code::kPeerLost) awaitCause(status);
  // An op that this rank's abort() ended in its wait says only "aborted": the peers get the
  // reason. Any other failure keeps its own words.
  if (!status.isOk() && !failed_) {
    const bool ended_by_abort =
        status.code() == common::Code::kAborted && queue_.abortRequested();
    fail(ended_by_abort ? abortedHere() : status, /*tell_peers=*/true);
  }
  // Right after executing, before the next drain: a caller's next op cannot look concurrent.
  // Own tensors submitted but not drained yet count too (Note [Batching window]).
  if (coordinator_ && !failed_) {
    coordinator_->noteStepBoundary(!entries_.empty() || !execution_.empty() ||
                                   queue_.submissionsPending());
  }
}

// A worker that sees a peer hang up may be early: the peer may have closed on a cause rank 0
// is relaying to every worker (an abort, a timeout), and rank 0's message to this rank can
// trail the peer's close. Wait for rank 0's word (Note [Failure fan-out]): it always comes
// unless rank 0 is gone (its channel ends the wait) or stopped, since rank 0 relays a cause at
// once and fails, telling everyone, when it sees a peer lost itself (shutting down itself, it
// relays the close alone: noteClosedWhileShuttingDown). So the bound is for a stopped rank 0
// only, and generous: on a loaded host a relay 100 ms late (the old bound) made a survivor
// blame the live peer that closed ("lost connection to rank 1", not its cause).
// A rank 0 of this machine that is stopped (SIGSTOP, a debugger) is seen as such: then the
// core fails at once with `seen`, saying so, rather than 2 s past the HVD_TIMEOUT that the
// survivor which closed met waiting for rank 0 (seen in the random programs' stops). A tracer's
// stop counts once it lasts: strace or py-spy stop a live rank 0 for moments.
void BackgroundLoop::awaitCause(const Status& seen) {
  constexpr double kCauseWaitSeconds = 2.0;
  constexpr int kStateCheckMs = 50;  // how often rank 0's state is read meanwhile
  constexpr int kTracedChecks = 4;   // 't' on this many checks in a row (150 ms): stopped
  transport::ControlChannel* channel = mesh_.rank() == 0 ? nullptr : mesh_.control(0);
  // Rank 0's ring may already hold other frames (responses of ops running now): read them and
  // keep waiting, until the cause comes (fail() sets failed_) or the time is up.
  const auto deadline = transport::tcp::deadlineAfter(kCauseWaitSeconds);
  readControl();
  for (int traced = 0; channel != nullptr && !failed_;) {
    const char state = processStateHere(mesh_, 0);
    traced = state == 't' ? traced + 1 : 0;
    if (state == 'T' || traced >= kTracedChecks) {
      // (no kAbort to rank 0: it reads nothing, and a full ring would hold this rank up)
      fail(Status(seen.code(), seen.message() + "; " + stoppedRankText(mesh_, 0) +
                                   ", so it relays no cause"),
           /*tell_peers=*/false);
      return;
    }
    const int left_ms = transport::tcp::millisecondsLeft(deadline, kStateCheckMs);
    if (left_ms <= 0) return;
    channel->waitReadable(left_ms);
    readControl();
  }
}

// A peer's connection hung up. Rank 0 knows whether that peer had begun to shut down: the
// usual cause of a rank's uneven end (it ran fewer steps than the others).
Status BackgroundLoop::lostConnection(int rank) const {
  const bool shut_down = coordinator_ && coordinator_->hasShutDown(rank);
  return common::peerLost("lost connection to rank " + std::to_string(rank) +
                          (shut_down ? ": it shut down (hvd.shutdown() or its process's exit) "
                                       "while this rank was still running"
                                     : ": the process exited or closed the connection"));
}

// A kAbort with `status` (its code byte, then its message: statusFromAbort reads it) on every
// control channel but `except`'s: a worker's reaches rank 0, rank 0's every worker (with
// `running_only`, none that rank 0 knows began to shut down).
void BackgroundLoop::sendAbort(const Status& status, int except, bool running_only) {
  std::string payload(1, static_cast<char>(status.code()));
  payload += status.message();
  for (int r = 0; r < mesh_.size(); ++r) {
    transport::ControlChannel* channel = mesh_.control(r);
    const bool shut_down = coordinator_ && coordinator_->hasShutDown(r);
    if (channel != nullptr && r != except && !(running_only && shut_down)) {
      channel->send(static_cast<uint32_t>(MessageType::kAbort), payload, 1.0);
    }
  }
}

Status BackgroundLoop::abortedHere() const {
  const std::string reason = queue_.abortReason();
  return common::aborted("aborted on rank " + std::to_string(mesh_.rank()) +
                         (reason.empty() ? "" : ": " + reason));
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
  execution_.clear();
  if (coordinator_) coordinator_->dropBatch();
}

// Note [One round] K, I: before a failure judges the pending round, the posts of remote ranks
// that have not answered it are read as they come, from connections still open, for at most
// kBoardPostsWait: every rank that posted sent its post before anything it did after, and a
// rank that did not post closes its board (a frame) once it fails too, so the wait ends in
// the time frames take, unless a peer is stopped or lost mid-send. (No wait on one host.)
void BackgroundLoop::awaitBoardPosts() {
  const auto until = Clock::now() + std::min<Clock::duration>(
      kBoardPostsWait, std::chrono::duration_cast<Clock::duration>(
                           std::chrono::duration<double>(config_.timeout_seconds)));
  std::vector<int> lost, missing = one_round_.remotesUnanswered();
  int wait_ms = 0;
  while (!missing.empty() && Clock::now() < until) {
    peer_ops_.readArrived(missing, wait_ms, &lost);
    missing = one_round_.remotesUnanswered();
    for (int r : lost) missing.erase(std::remove(missing.begin(), missing.end(), r), missing.end());
    wait_ms = 1;
  }
}

// A timeout names the ranks of this machine that are stopped: the peer this rank (or the rank
// whose failure this is) waited for may itself be waiting for one of them, and a survivor's
// error then names the stopped rank whichever wait ended first (a pipeline's stopped stage 0
// at np 3: stage 2 timed out on stage 1, which waited for stage 0). The op that timed out
// gets it through the executor's refiner, the rank's failure here; a rank named is not again.
Status BackgroundLoop::withStoppedRanks(const Status& status) const {
  if (status.code() != common::Code::kTimeout) return status;
  return Status(status.code(), status.message() + stoppedRanksNote(mesh_, status.message()));
}

void BackgroundLoop::fail(const Status& cause, bool tell_peers) {
  if (failed_) return;
  failed_ = true;
  const Status status = withStoppedRanks(cause);
  HVD_LOG(kWarning, "runtime") << "core failed: " << status.message();
  // Note [Failure fan-out]: the reason travels to every rank (kAbort with the status code,
  // relayed by rank 0), so a survivor reports the real cause — e.g. the rank that died — not
  // the rank that told it. A lost peer is also seen by every survivor on its own connection
  // (the mesh is complete), so for that cause this rank keeps its sockets open: closing them
  // would make slower survivors blame a live rank. Other causes (abort, timeout, malformed
  // input) are invisible to peers, so the connections are closed as well.
  if (tell_peers) {
    delayFailureNoticeForTests();
    sendAbort(status);
  }
  // Note [One round] I: ops of a round every rank answered finish here as on the others (not
  // from inside an op: the Executor is not reentrant, and that op's failure is the cause).
  if (!executor_.executing()) {
    awaitBoardPosts();  // Note [One round] K
    one_round_.finishAnswered(entries_, [](coord::Key) {}, runOneRound());
  }
  one_round_.close();  // peers waiting on this rank's next post stop waiting
  completeAllPending(status, /*store_failure=*/true);
  peer_ops_.failAll(status);
  metrics_.setLastError(status.message());
  if (tell_peers) flushControl();
  if (status.code() != common::Code::kPeerLost) mesh_.close();
  if (queue_.shutdownRequested()) finished_ = true;
}

// Frees the keys of names nothing refers to any more (Note [Key lifetime] in key_table.cc):
// names in flight on this rank are kept by the table itself; here go the other holders.
void BackgroundLoop::sweepKeys() {
  keys_.sweep([this](const coord::KeyTable::MarkFn& mark) {
    if (coordinator_) coordinator_->markKeys(mark);  // its tables, parked and held requests
    execution_.markKeys(mark);
    if (requests_) requests_->markKeys(mark);
  });
}

}  // namespace hvd::runtime
