// The caller-driven pass of BackgroundLoop (background_loop.h): a framework thread about to
// block on its own op runs the loop's passes itself. Note [Caller drives] below.
#include <algorithm>

#include "common/cpu_relax.h"
#include "runtime/background_loop.h"

namespace hvd::runtime {

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
//   D. Only where every peer is on shm; elsewhere submit() wakes the loop thread whatever the
//      caller asked. TCP rings keep per-thread helpers (a ReduceWorker thread, scratch) that
//      should not be made on every framework thread. On shm they remain for the ring-based
//      ops (reducescatter, an allreduce in a set without the host segment): a thread that
//      drives one of those gets its own scratch buffer (and, for large ones, an idle helper
//      thread) for its lifetime — in practice only the main thread.
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
//
// Note [Spin backoff]
// A spin pays only while the peers run: on a host with more runnable threads than cores, two
// ranks can share one core's run queue, and then the spinner holds the core its peer needs
// for the whole budget — every op costs the budget plus a wake-up (np=2, load 6-7: 4 B ops at
// ~255 us in about half the launches, ~15 us in the others; with no spin 55-100 us in every
// launch). So after kMissesToBackOff drives in a row that spun (ran more than one pass) until
// the budget ran out with the op unfinished, a caller does not spin (one pass, then it blocks
// and the loop thread takes over), except every kProbeEvery-th drive, which spins to see
// whether spinning pays again; a drive that spun and finished its op resets the count. A
// single pass proves nothing either way (the peers' requests were already there, or the
// caller slept on the mutex for its budget) and leaves the count alone. A peer that is merely
// late (uneven work before the op) backs off too, and there the spin was wasted as well.
namespace {
constexpr int kMissesToBackOff = 3;
constexpr uint32_t kProbeEvery = 16;
// A caller asleep on the mutex wakes this often to see whether the loop thread finished its
// op meanwhile (a long pass may hold the mutex for the whole budget).
constexpr auto kLockSlice = std::chrono::microseconds(50);
}  // namespace

bool BackgroundLoop::drive(int64_t handle) {
  // E. An async op's caller went on while the loop thread, already awake, worked on it.
  if (!drivable_ || !handles_.callerWaits(handle)) {
    queue_.wakeForWaiter();  // a napping loop may hold this op's submission (Note [Coalesced wakes])
    return false;
  }
  const uint32_t drive_number = drives_.fetch_add(1, std::memory_order_relaxed);
  const bool backed_off = spin_misses_.load(std::memory_order_relaxed) >= kMissesToBackOff &&
                          drive_number % kProbeEvery != 0;
  const auto spin = backed_off ? std::chrono::microseconds(0) : caller_spin_;
  if (backed_off || spin.count() == 0) metrics_.countSpinSkipped();
  const auto give_up = Clock::now() + spin;
  std::unique_lock<std::timed_mutex> lock(progress_, std::defer_lock);
  while (!lock.try_lock_for(std::min<Clock::duration>(kLockSlice, give_up - Clock::now()))) {
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
  bool done = false;
  int passes = 0;
  while (!failed_ && !finished_ && !queue_.shutdownRequested()) {
    pass(/*mark_cycle=*/false);
    ++passes;
    done = handles_.poll(handle) != 0;
    if (done || Clock::now() >= give_up) break;
    if (mesh_.spinYields()) sched_yield(); else common::cpuRelax();
  }
  if (done) metrics_.countDriven();
  if (passes > 1 && done) {  // Note [Spin backoff]
    spin_misses_.store(0, std::memory_order_relaxed);
  } else if (passes > 1 && !failed_ && !finished_ && !queue_.shutdownRequested()) {
    spin_misses_.fetch_add(1, std::memory_order_relaxed);
  }
  const bool keep_standby = done && quiet_loop && !failed_ && !finished_ && idle();  // C
  lock.unlock();
  if (!keep_standby) {
    queue_.wakeIfAsleep();
    // A loop that took progress_ before standby_ was cleared may nap on wake_fd_ alone.
    if (!done) queue_.wakeForWaiter();
  }
  return done;
}

}  // namespace hvd::runtime
