// The caller-driven pass of BackgroundLoop (background_loop.h): a framework thread about to
// block on its own op runs the loop's passes itself. Note [Caller drives] below.
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
//   A. Passes are serialised by progress_; a caller only try_locks it, within its spin
//      budget, so a loop thread in the middle of a long op is never waited for — the caller
//      then blocks as before. (Giving up at the first failed try can lock ranks into a mode
//      where the loop thread, woken by each peer message, holds the lock whenever a caller
//      comes: one benchmark run showed 281 us per 1 KiB op, the loop thread doing the work,
//      against 15-19 us in every other run and size.)
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
bool BackgroundLoop::drive(int64_t handle) {
  // E. An async op's caller went on while the loop thread, already awake, worked on it.
  if (!drivable_ || !handles_.callerWaits(handle)) {
    wakeForWaiter();  // a napping loop may hold this op's submission (Note [Coalesced wakes])
    return false;
  }
  const auto give_up = Clock::now() + caller_spin_;
  std::unique_lock<std::mutex> lock(progress_, std::defer_lock);
  while (!lock.try_lock()) {  // A
    if (handles_.poll(handle) != 0) return false;  // the loop thread finished it
    if (Clock::now() >= give_up) {
      wakeIfAsleep();
      wakeForWaiter();  // the loop may nap with this op undrained (Note [Coalesced wakes])
      return false;
    }
    common::cpuRelax();
  }
  const bool quiet_loop =
      !timeline_detail_.load(std::memory_order_relaxed) && !coordinates_other_sets_;
  standby_.store(quiet_loop);  // B
  bool done = false;
  while (!failed_ && !finished_ && !shutdown_requested_) {
    pass(/*mark_cycle=*/false);
    done = handles_.poll(handle) != 0;
    if (done || Clock::now() >= give_up) break;
    common::cpuRelax();
  }
  if (done) metrics_.countDriven();
  const bool keep_standby = done && quiet_loop && !failed_ && !finished_ && idle();  // C
  lock.unlock();
  if (!keep_standby) {
    wakeIfAsleep();
    // A loop that took progress_ before standby_ was cleared may nap on wake_fd_ alone.
    if (!done) wakeForWaiter();
  }
  return done;
}

}  // namespace hvd::runtime
