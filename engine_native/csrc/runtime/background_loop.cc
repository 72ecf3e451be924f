// BackgroundLoop's threads (background_loop.h): construction and teardown, the loop thread
// (run; its sleep is in loop_sleep.cc), the shutdown agreement, and framework threads that run
// passes themselves (drive, Note [Caller drives]). One pass and its steps are in loop_pass.cc.
#include "runtime/background_loop.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>

#include "common/cpu_relax.h"
#include "common/logging.h"
#include "common/poll_pacer.h"
#include "transport/shm/collective_segment.h"

namespace hvd::runtime {

using common::Status;
using coord::MessageType;
using Clock = std::chrono::steady_clock;

namespace {

const char* kShutdownMessage =
    "Horovod has been shut down. This was caused by an exception on one of the ranks or an "
    "attempt to allreduce, allgather or broadcast a tensor after one of the ranks finished "
    "execution. If the shutdown was caused by an exception, you should see the exception in "
    "the log before the first shutdown message.";

// Note [Caller drives] G: how long moving point-to-point bytes may keep a caller driving.
constexpr auto kMaxRenewedSpin = std::chrono::seconds(1);
// How often a spin past its budget reads whether a core is still free (Note [Spin while a core
// is free] C).
constexpr auto kHeadroomSlice = std::chrono::microseconds(100);

}  // namespace

BackgroundLoop::BackgroundLoop(transport::Mesh& mesh, HandleTable& handles,
                               ProcessSetTable& sets, Metrics& metrics,
                               const common::Config& config, timeline::Timeline* timeline,
                               Autotuner* autotuner, const CpuBinding& binding)
    : mesh_(mesh), rank_zero_(mesh.rank() == 0), spin_yields_(mesh.spinYields()),
      handles_(handles), sets_(sets), metrics_(metrics), config_(config),
      timeline_(timeline),
      queue_(handles, keys_),
      peer_ops_(mesh, handles, queue_, metrics, timeline, config.timeout_seconds,
                /*cuda_ipc=*/config.gpu_path != "staged",
                /*nccl_demanded=*/config.gpu_path == "nccl",
                static_cast<uint64_t>(config.p2p_split_min_bytes)),
      executor_(handles, metrics, config, timeline, keys_, queue_.wakeFd()),
      headroom_(binding.bound ? binding.host_cores : 0),
      execution_(mesh, sets, config, metrics, executor_, keys_, entries_, autotuner),
      stalls_(metrics, config, keys_, queue_),
      one_round_(mesh, keys_) {
  connectBoardFrames();
  // Several peers may look lost by the time a collective notices; one of them may already have
  // sent the original cause (Note [Failure fan-out]), which then wins over this rank's guess.
  executor_.setFailureRefiner([this](const Status& status) {
    if (status.code() != common::Code::kPeerLost) return withStoppedRanks(status);
    awaitCause(status);
    return failed_ ? failure() : status;
  });
  names_epoch_ = handles_.attachNames(&keys_);
  if (mesh_.rank() == 0) {
    coordinator_ = std::make_unique<RankZeroCoordinator>(mesh_.size(), keys_, sets_, config_,
                                                         autotuner);
  } else {
    requests_ = std::make_unique<WorkerRequests>(keys_, config_.cache_capacity);
  }
  std::vector<std::string> transports(mesh_.size());
  std::vector<std::string> controls(mesh_.size());
  bool all_shm = true;  // Note [Caller drives] D: point-to-point drives only then
  for (int r = 0; r < mesh_.size(); ++r) {
    transport::Pair* pair = mesh_.pair(r);
    transports[r] = pair == nullptr ? "self"
                    : pair->kind() == transport::PairKind::kShm ? "shm" : "tcp";
    all_shm = all_shm && transports[r] != "tcp";
    const transport::ControlChannel* channel = mesh_.control(r);
    controls[r] = channel == nullptr ? "none" : channel->sharedMemory() ? "shm" : "tcp";
  }
  metrics_.setTransports(std::move(transports), std::move(controls));
  const transport::shm::CollectiveSegment* host = mesh_.collectiveSegment();
  if (host == nullptr) {
    metrics_.setHostCopy("none", "no host collective segment: one rank on this host, "
                                 "HVD_TRANSPORT=tcp, or the segment could not be made");
  } else if (host->singleCopy() == transport::shm::SingleCopyScope::kEveryOp) {
    metrics_.setHostCopy("single-copy", "");
  } else if (host->singleCopy() == transport::shm::SingleCopyScope::kBroadcast) {
    metrics_.setHostCopy("single-copy broadcast", host->singleCopyReason());
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
  // More ranks than cores: the spin yields between passes (Note [Yielding spins], mesh.cc).
  drive_.configure(true, std::chrono::microseconds(config_.caller_spin_microseconds),
                   all_shm ? ~uint64_t{0} : kTcpDriveMaxBytes);  // Note [Caller drives] D
  peer_drive_.configure(all_shm, all_shm ? drive_.configuredSpin() : std::chrono::microseconds(0));
  // Note [Spin while a core is free] B: bound ranks whose spins do not yield have CPUs of their
  // own (Note [CPU binding] C, D)
  if (all_shm && binding.bound && !spin_yields_) {
    peer_spin_cap_ = std::min<std::chrono::microseconds>(
        std::chrono::microseconds(config_.p2p_spin_max_microseconds), kMaxRenewedSpin);
  }
  metrics_.setSpinYields(mesh_.spinYields());
  metrics_.setCallerSpin(drive_.configuredSpin().count());
}

BackgroundLoop::~BackgroundLoop() {
  if (thread_.joinable()) {
    shutdown();
  }
  handles_.detachNames(names_epoch_);  // before keys_ goes
}

void BackgroundLoop::start() { thread_ = std::thread([this] { run(); }); }

bool BackgroundLoop::idle() const { return collectivesIdle() && peer_ops_.idle(); }

bool BackgroundLoop::collectivesIdle() const {
  return entries_.empty() && execution_.empty() && (!requests_ || requests_->empty()) &&
         (!coordinator_ || coordinator_->idle()) && !executor_.deviceBusy() &&
         !queue_.shutdownRequested() && !queue_.abortRequested() && !controlBacklog();
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
  { std::lock_guard<std::timed_mutex> drained(progress_); }  // a driving caller left its pass
  // A caller in awaitPeer leaves within its slice (its op failed, which rang its doorbell) and
  // touches the mesh until then (Note [Caller sleeps on the doorbell] F).
  while (peer_sleeper_.load()) std::this_thread::sleep_for(kLockSlice);
}

void BackgroundLoop::abort(const std::string& reason) {
  queue_.requestAbort(reason);
  mesh_.abort();  // ends any wait inside a collective at once
  queue_.wake();
}

void BackgroundLoop::run() {
  std::unique_lock<std::timed_mutex> lock(progress_, std::defer_lock);
  std::vector<int> readable_controls, readable_peers;
  while (true) {
    bool idle_tick = false;
    const int ready_listen_fd = waitForWork(&readable_controls, &readable_peers, &idle_tick);
    lock.lock();
    if (finished_) break;  // a driving caller may have finished the shutdown agreement
    // Under progress_: a driving caller's fail() may have closed the mesh meanwhile.
    if (transport::shm::Doorbell* bell = mesh_.controlDoorbell()) transport::shm::endSleep(bell);
    peer_ops_.endSleep();
    for (int r : readable_controls) {
      if (transport::ControlChannel* channel = mesh_.control(r)) channel->markSocketReadable();
    }
    for (int r : readable_peers) peer_ops_.markReadable(r);
    if (ready_listen_fd >= 0 && !failed_ && ready_listen_fd == mesh_.listenFd()) {
      mesh_.acceptStray();
    }
    if (pass(/*by_loop_thread=*/true) && idle_tick) metrics_.countTickPickup();
    if (finished_) break;
    if (!idle() || coordinatesOtherSets()) queue_.setStandby(false);  // Note [Caller drives] B, C
    lock.unlock();
  }
  // What point-to-point still had in flight when the agreement ended (Note [Point-to-point] F).
  peer_ops_.failAll(Status(common::Code::kShutDown, kShutdownMessage));
  flushControl();
  mesh_.close();
}

// Note [Tick pickups]
// The loop sleeps until something wakes it (a submission's wake byte, a control frame, a
// connection, the device) or its idle tick runs out. A pass that follows a whole idle tick
// and still takes a submission or receives a control frame found work that woke nobody: it
// waited for the tick (up to 200 ms) instead of being answered at once. metrics() counts such
// passes as tick_pickups, so a test can check that ops are answered without the tick by
// count, not by timing them; a wake that races the tick's end can add one.

// Zero while work is queued (unless it waits for the device, which wakes the loop); until the
// batching window closes while rank 0 holds responses (rounded up: the window may end up to a
// millisecond late, never early); else the idle tick.
int BackgroundLoop::timeoutMs() const {
  if (!execution_.empty() && !execution_.waitingForDevice()) return 0;
  if (!coordinator_ || coordinator_->window().empty()) return kTickMs;
  // Executing may just have left the held batch all rank 0 has in flight (Note [Batching
  // window]): the next pass sends it.
  if (ownBlocked()) return 0;
  const auto left = coordinator_->window().end() - Clock::now();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(left).count();
  return us <= 0 ? 0 : static_cast<int>(std::min<int64_t>((us + 999) / 1000, kTickMs));
}

// ---- shutdown agreement ----------------------------------------------------------------------
// Every rank tells rank 0 it is shutting down, rank 0 answers once all have, and a rank gives
// up waiting after HVD_TIMEOUT (one second when it still had work queued, so peers blocked on
// it are not held long). While it waits, rank 0 goes on coordinating (loop_pass.cc), so ranks
// still running keep their sets' collectives until it gives up (replicas of a pipeline that
// end apart); an op with a rank that shut down still fails when that rank closes.

void BackgroundLoop::beginShutdown() {
  shutdown_sent_ = true;
  shutdown_deadline_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(config_.timeout_seconds));
  Status status(common::Code::kShutDown, kShutdownMessage);
  if (!entries_.empty()) {
    // Peers may be blocked in a collective with this rank: do not make them wait long.
    shutdown_deadline_ = std::min(shutdown_deadline_, Clock::now() + std::chrono::seconds(1));
  }
  one_round_.close();
  completeAllPending(status, /*store_failure=*/false);
  peer_ops_.beginShutdown(status);  // Note [Point-to-point] F: what this rank owes goes on
  if (failed_ || mesh_.size() == 1) {
    finished_ = true;
    return;
  }
  if (mesh_.rank() == 0) {
    coordinator_->noteShutdown(0);
  } else {
    Status sent = mesh_.control(0)->send(static_cast<uint32_t>(MessageType::kShutdown), "", 1.0);
    if (!sent.isOk()) finished_ = true;
  }
}

// Rank 0, shutting down, sees worker `rank`'s channel end: that worker shut down too (or
// died). Ranks still running will see its connections hang up and wait for rank 0's word on
// why (Note [Failure fan-out]); a rank 0 that shuts down fails on nothing, so it says it here,
// once, or each such rank waited out awaitCause's 2 s (random programs: a rank shut down, rank
// 0's receive from it timed out and its program ended, the third rank's error came at 5 s).
// A worker whose kShutdown rank 0 has not read yet gets it too: for it, it only ends the
// wait for the others (handleCoordinatorMessage).
void BackgroundLoop::noteClosedWhileShuttingDown(int rank) {
  if (!closed_in_shutdown_.insert(rank).second) return;
  const Status lost = lostConnection(rank);
  coordinator_->noteShutdown(rank);
  sendAbort(lost, rank, /*running_only=*/true);
}

void BackgroundLoop::checkShutdownAgreement() {
  if (finished_) return;
  if (mesh_.rank() == 0 && coordinator_->shutDownRanks() == mesh_.size()) {
    for (int w = 1; w < mesh_.size(); ++w) {
      mesh_.control(w)->send(static_cast<uint32_t>(MessageType::kShutdown), "", 1.0);
    }
    finished_ = true;
    return;
  }
  if (Clock::now() > shutdown_deadline_) {
    HVD_LOG(kWarning, "runtime") << "shutdown: not every rank shut down within "
                                 << config_.timeout_seconds << " s; closing anyway";
    finished_ = true;
  }
}

// ---- callers that drive ----------------------------------------------------------------------

// Note [Caller drives]
// A synchronous op costs four sleeping hand-offs when only the loop thread communicates:
// caller -> loop (submit), worker -> rank 0 (request), rank 0 -> worker (response), loop ->
// caller (completion), each a scheduler wake-up of ~20 us on this kind of machine. A caller
// about to block on its handle instead runs the loop's passes itself (its op was submitted
// with wake=false, so the loop thread stays asleep): no hand-off between threads of a rank,
// and while every rank of the host has a core, the caller polls its control channel and the
// shm segment for up to HVD_CALLER_SPIN_US rather than sleeping, so a small op costs a few
// socket messages and no wake-up at all. Rules:
//   A. Passes are serialised by progress_; a caller waits for it at most its spin budget,
//      asleep on the mutex (try_lock_for), so a loop thread in the middle of a long op is
//      never waited for beyond that — the caller then blocks on its handle as before.
//      (Giving up at the first failed try can lock ranks into a mode where the loop thread,
//      woken by each peer message, holds the lock whenever a caller comes: one benchmark run
//      showed 281 us per 1 KiB op, the loop thread doing the work, against 15-19 us in every
//      other run and size. Spinning on try_lock instead took the core that loop thread needed
//      to finish its pass on a loaded host: async allreduces + one waited allgather per
//      iteration, np=2, load 4-6, ran at ~1 ms in half the launches, the callers driving 0-84
//      of 400 ops, against 0.08-0.13 ms and ~395 driven in 6 of 6 launches asleep on the lock.)
//   B. While a caller drives, standby_ tells the loop thread to sleep on wake_fd_ (and its
//      200 ms tick) only, so messages the caller is waiting for do not also wake it. Leaving
//      standby (an async submit, a caller giving up, shutdown, abort, a process set added or
//      removed, the timeline file started) wakes it. Never on rank 0 while it coordinates a
//      set it is not in (that set's requests need the loop thread), nor while a timeline
//      file is written (NEGOTIATE spans time arrivals as they happen).
//   C. A caller leaves standby on only when its op finished and the loop is idle, so no
//      response, held batch or window timer is left without a thread that watches it.
//   D. Collectives also where peers are on TCP (other hosts, HVD_TRANSPORT=tcp), up to
//      kTcpDriveMaxBytes there: the caller reads their sockets on its passes, so a small op of
//      the board across hosts (Note [One round] K) is a message each way that its caller
//      finishes. The loop thread in standby polls the point-to-point sockets (unasked bytes
//      must be read: test_standby_tcp.py). Woken by one while a caller drives, it parks
//      (loop_sleep.cc): it sleeps on wake_fd_ alone, off progress_, in kStandbyPark quanta
//      (20 ms: each one's end wakes it on a core a caller spins on) until one passes with no
//      caller driving, or about an idle tick has passed (a wake ends it sooner); the pass
//      after it reads the sockets that woke it. Whenever the loop thread is in no poll of them
//      (parked, or waiting for progress_), a driving caller's passes read every TCP socket
//      (PeerOps::setSocketsWatched), so bytes sent unasked move meanwhile.
//      (Fighting the caller for progress_, or parking one quantum and then taking it for a
//      pass, left stretches of ops at 15-60 us instead of 11: RESULTS.md, "Small ops across
//      hosts".) A larger op over TCP is left to the loop thread, as before: driven, 4-64 MiB
//      took 0.66-1.15x the time (forced TCP, run_all.py --cases tcp; mixed), up to 1 MiB
//      0.06-0.63x. A thread driving a ring-based op (TCP, reducescatter, a set without the
//      host segment) keeps its own scratch and idle helper thread for its lifetime (in practice
//      the main thread). Point-to-point drives only where every peer is on shm (its waits
//      sleep on the peer doorbell, which no socket rings: peer_await.cc).
//   E. Only ops enqueued for an at-once wait: async ops (a step's gradients) are already
//      being worked on by the woken loop thread. (Tried: letting waits on async ops drive too
//      changed neither the DistributedOptimizer step of bench_torch_step.py nor the
//      200 x 4 KiB set beyond run-to-run noise.)
//   F. Signals: a caller inside a pass sees Ctrl-C only after the pass. A pass never waits
//      for negotiation (that is non-blocking); it waits only inside collectives every rank
//      agreed to (its own, and whatever else is queued before it, async batches included),
//      which end when the data has moved, a peer is lost, or HVD_TIMEOUT passes. A stalled
//      op — a rank that never submits it — is never agreed, so the caller gives up its spin
//      and waits in 50 ms slices that see Ctrl-C, as before.
//   G. A pass that moved point-to-point bytes renews the spin budget: a message larger than
//      its ring streams through it only while both sides pass, and a caller that gave up
//      after 200 us left the rest to two loop threads waking each other once per ring's
//      worth (64 MiB over a 1 MiB ring: 1.7 GB/s against 7 GB/s while driven). Moving bytes
//      is work, not a wait, so Note [Spin backoff]'s reasons do not apply. Renewals end
//      kMaxRenewedSpin after the drive began (bytes of other messages streaming in must not
//      keep a caller from Ctrl-C beside a stalled op).
//   H. An async point-to-point send (isend) is written, and an async receive (irecv) posted,
//      by its caller when no pass is running (one point-to-point pass, not a whole one: no
//      collective runs inside an isend), and the loop thread is woken only if that could not
//      be done: on shared memory the frame is in the peer's ring at once. Waking the loop for
//      each isend cost a context switch on the sender's core: in a hand-off-bound pipeline
//      step (np=2, 2 cores, torch computing beside) an isend call took ~220 us against 8 us
//      alone (cProfile of bench_pipeline.py). And, unlike E, a wait on either drives it: the
//      loop thread was not woken for them, and a receive's wait is where a pipeline stage
//      waits for its neighbour's hand-off (read by the waiting caller, not handed over by the
//      loop thread: two context switches fewer on the critical path). Point-to-point waits
//      keep their own Note [Spin backoff] record (peer_drive_): a pipeline stage's receive
//      mostly waits for its neighbour's compute, and those misses must turn off neither the
//      collectives' spins nor be hidden from their own. A receive spinning out its budget
//      holds a core the computing neighbour may need (np=2 on this 2-core VM: 1F1B step 38-57
//      ms with the spin, 20-25 ms without, load 7); where its messages come within the spin
//      (a ping-pong, a stage that waits little) its spins pay and it keeps them. Past the
//      budget it spins on while the host has a core free (Note [Spin while a core is free]
//      in core_headroom.cc): a wait outliving the spin cost a wake-up on each side.
//   I. A point-to-point wait whose drive gives up does not wake a loop thread that sleeps
//      watching everything (watches_all_: its sleep began out of standby) while no collective
//      work is in flight: the drive changed nothing but point-to-point state, and the caller
//      now sleeps on the peer doorbell and reads what comes itself (Note [Caller sleeps on
//      the doorbell] in peer_await.cc). Waking it anyway cost every late receive of a
//      pipeline stage a loop wake-up for one empty pass, on a core its neighbour computes on.

bool BackgroundLoop::drive(int64_t handle) {
  const bool point_to_point = handles_.pointToPoint(handle);
  DrivePolicy& policy = point_to_point ? peer_drive_ : drive_;  // D, H
  // E. An async op's caller went on while the loop thread, already awake, worked on it.
  if (!policy.drivable() || !handles_.callerWaits(handle)) {
    // A napping loop may hold this op's submission (Note [Coalesced wakes]); rank 0's sleeping
    // one may hold a batch this wait now blocks (Note [Batching window]).
    queue_.wakeForWaiter();
    if (rank_zero_) queue_.wakeIfAsleep();
    return false;
  }
  const auto spin = policy.nextSpin();  // Note [Spin backoff] in drive_policy.h
  if (spin.count() == 0) metrics_.countSpinSkipped();
  const auto start = Clock::now();
  auto give_up = start + spin;
  // Note [Spin while a core is free] A: the furthest a point-to-point wait spins on.
  const auto spin_cap = point_to_point && spin.count() > 0 ? start + peer_spin_cap_ : give_up;
  std::unique_lock<std::timed_mutex> lock(progress_, std::try_to_lock);  // mostly free
  while (!lock.owns_lock() &&
         !lock.try_lock_for(std::min<Clock::duration>(kLockSlice, give_up - Clock::now()))) {
    if (handles_.poll(handle) != 0) return false;  // A: the loop thread finished it
    if (Clock::now() >= give_up) {
      queue_.wakeIfAsleep();
      queue_.wakeForWaiter();  // the loop may nap with this op undrained (Note [Coalesced wakes])
      return false;
    }
  }
  if (handles_.poll(handle) != 0) return false;  // the loop thread finished it
  const bool quiet_loop =
      !timeline_detail_.load(std::memory_order_relaxed) && !coordinatesOtherSets();
  queue_.setStandby(quiet_loop);  // B
  struct Marked {  // D's park; cleared also if a pass throws (not after: another caller's)
    std::atomic<bool>& flag;
    bool armed = true;
    ~Marked() { if (armed) flag.store(false); }
  } marked{caller_driving_};
  caller_driving_.store(true);
  drives_started_.fetch_add(1);
  executor_.setAwaitedHandle(handle);  // Note [Caller waits on the device] A, F
  peer_ops_.setAwaitedHandle(handle);
  bool done = false;
  bool queued = false;  // its CUDA op is on the device, the caller's to poll
  int passes = 0;
  bool extended = false;  // Note [Spin while a core is free] A
  {
    // Note [Point-to-point over shm] C: cleared before idle() below reads the rings, also if
    // a pass throws.
    struct Driving {
      PeerOps& ops;
      explicit Driving(PeerOps& o) : ops(o) { ops.setDriving(true); }
      ~Driving() { ops.setDriving(false); }
    } driving(peer_ops_);
    peer_ops_.takeMoved();  // G counts this drive's passes only
    const auto renew_until = Clock::now() + kMaxRenewedSpin;
    while (!failed_ && !finished_ && !queue_.shutdownRequested()) {
      pass(/*by_loop_thread=*/false);
      ++passes;
      done = handles_.poll(handle) != 0;
      if (done) break;
      // Note [Caller waits on the device] B: from here awaitDevice() polls its event, paced.
      queued = executor_.callerPollsDevice(handle) || peer_ops_.callerPollsDevice(handle);
      if (queued) break;
      const auto now = Clock::now();
      if (spin.count() > 0 && peer_ops_.takeMoved()) {  // G
        give_up = std::max(give_up, std::min(now + spin, renew_until));
      }
      if (now >= give_up) {
        if (now >= spin_cap || !headroom_.coreFree()) break;
        give_up = std::min(now + kHeadroomSlice, spin_cap);
        extended = true;
      }
      if (spin_yields_) sched_yield(); else common::cpuRelax();
    }
  }
  metrics_.countCallerPasses(passes);
  if (done || queued) metrics_.countDriven();
  if (extended) metrics_.countSpinExtended();
  if (queued || (passes > 1 && done)) {  // Note [Spin backoff]
    policy.spinPaid();
  } else if (passes > 1 && !failed_ && !finished_ && !queue_.shutdownRequested()) {
    policy.spinMissed();
  }
  executor_.setAwaitedHandle(-1);
  peer_ops_.setAwaitedHandle(-1);
  const bool keep_standby = done && quiet_loop && !failed_ && !finished_ && idle();  // C
  const bool let_sleep = !done && point_to_point && watches_all_ && !failed_ && !finished_ &&
                         collectivesIdle() && !peer_ops_.ringsCanMove();  // I
  if (let_sleep) queue_.setStandby(false);  // before a loop thread can read it again
  caller_driving_.store(false);  // under progress_, before the wakes below (D's park)
  marked.armed = false;
  lock.unlock();
  if (!keep_standby && !let_sleep) {
    queue_.wakeIfAsleep();
    // A loop that took progress_ before standby_ was cleared may nap on wake_fd_ alone.
    if (!done) queue_.wakeForWaiter();
  }
  return done;
}

// Note [Caller waits on the device] B, D, E in device_executor.cc.
bool BackgroundLoop::awaitDevice(int64_t handle, std::chrono::milliseconds slice,
                                 Clock::time_point since) {
  // The common case: no lock taken.
  if (!executor_.callerPollsAnyDevice() && !peer_ops_.callerPollsAnyDevice()) return false;
  const auto end = Clock::now() + slice;
  const common::PollPacer pacer(since);
  // B: the caller's spin budget, from the wait's start, before the naps.
  // (point-to-point waits keep their own spin record: Note [Caller drives] H)
  const DrivePolicy& policy = handles_.pointToPoint(handle) ? peer_drive_ : drive_;
  const auto spin_until = since + policy.currentSpin();
  bool polled = false;
  while (true) {
    {
      std::unique_lock<std::timed_mutex> lock(progress_, std::defer_lock);
      if (!lock.try_lock_for(end - Clock::now())) return polled;
      if (failed_ || finished_ ||
          !(executor_.callerPollsDevice(handle) || peer_ops_.callerPollsDevice(handle))) {
        return polled;
      }
      polled = true;
      const Status device = executor_.pollDevice();
      if (!device.isOk()) fail(device, /*tell_peers=*/true);
      const Status copies = failed_ ? Status::ok() : peer_ops_.pollDevice();  // F
      if (!copies.isOk()) peerOpsFailed(copies);
      if (handles_.poll(handle) != 0) {
        if (!failed_ && copies.isOk()) metrics_.countCallerPolled();
        return true;
      }
      if (failed_) return true;
    }
    const auto now = Clock::now();
    if (now >= end) return true;
    if (now >= spin_until) {
      pacer.nap(end);
    } else {
      common::spinPause(spin_yields_);  // progress_ is free meanwhile for the loop
    }
  }
}

}  // namespace hvd::runtime
