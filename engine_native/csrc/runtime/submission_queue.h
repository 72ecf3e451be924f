// SubmissionQueue: the framework-thread side of BackgroundLoop (background_loop.h). Framework
// threads submit() entries (taking their names' keys and creating their handles), request
// shutdown or abort and wake the loop; the loop thread take()s the entries each pass and sleeps
// on wakeFd() (Notes [Wake only a sleeper] and [Coalesced wakes] in submission_queue.cc). It
// also holds the sticky failure later submissions are refused with. Thread-safe: every field
// below says which lock or atomic guards it.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "coord/key_table.h"
#include "runtime/handle_table.h"
#include "runtime/tensor_entry.h"

namespace hvd::runtime {

class SubmissionQueue {
 public:
  // `keys` is the loop's: the names in flight are the keys it holds.
  SubmissionQueue(HandleTable& handles, coord::KeyTable& keys);
  ~SubmissionQueue();  // closes the eventfd, after the loop's Executor (which writes it) went
  SubmissionQueue(const SubmissionQueue&) = delete;
  SubmissionQueue& operator=(const SubmissionQueue&) = delete;

  // The loop's eventfd: the loop sleeps on it, submitters and device completions write it.
  int wakeFd() const { return wake_fd_; }

  // ---- framework threads ----
  // BackgroundLoop::submit (background_loop.h): all entries or none (a duplicate name fails
  // the call). caller_waits: the handles' flag (Note [Caller drives] E); wake: wake the loop
  // now, else only mark the submission pending for the caller's drive() or the next pass.
  common::Status submit(TensorEntry* entries, const std::string_view* names, size_t count,
                        bool caller_waits, bool wake);
  // Lock-free: a failure is stored (failure() then reads it under the lock).
  bool hasFailure() const { return has_failure_.load(std::memory_order_acquire); }
  common::Status failure() const;
  void requestShutdown();
  // The caller aborts the mesh, then wake()s the loop.
  void requestAbort(const std::string& reason);
  void wake();
  void wakeIfAsleep();   // Note [Wake only a sleeper]; also leaves standby
  void wakeForWaiter();  // Note [Coalesced wakes]

  // ---- either side ----
  bool shutdownRequested() const { return shutdown_requested_; }
  bool abortRequested() const { return abort_requested_; }
  std::string abortReason() const;
  bool standby() const { return standby_.load(); }
  void setStandby(bool on) { standby_.store(on); }  // Note [Caller drives] B
  // Relaxed: a hint for the step memory (Note [Batching window]), not a synchronisation.
  bool submissionsPending() const { return submissions_pending_.load(std::memory_order_relaxed); }

  // ---- the thread that holds the loop's progress_ ----
  // Swaps the submitted entries into *out (empty on entry); clears the pending flags.
  void take(std::vector<TensorEntry>* out);
  // Completes every submitted entry with `status`; store_failure: later push()es fail with it.
  void failAll(const common::Status& status, bool store_failure);
  // Before the loop blocks for up to timeout_us (nap_us > 0: a nap, Note [Coalesced wakes]):
  // announces the sleep and answers the timeout to use (0: a submission is already here).
  int64_t beginSleep(int64_t timeout_us, int64_t nap_us);
  void endSleep();
  void consumeWake();  // reads wake_fd_ after the poll saw it readable
  // Sleeps on wake_fd_ alone in quanta of quantum_us while keep() (asked before each) says so;
  // a wake or a pending submission ends it (Note [Caller drives] D's park).
  void park(int64_t quantum_us, const std::function<bool()>& keep);

 private:
  // Moves the entries in, or leaves them and answers why not (the stored failure, shutdown).
  common::Status push(TensorEntry* entries, size_t count);

  HandleTable& handles_;
  coord::KeyTable& keys_;  // thread-safe (its own lock)
  int wake_fd_ = -1;  // an eventfd, for the queue's lifetime

  // Guarded by mutex_ (written by framework threads and by the loop's failure path).
  mutable std::mutex mutex_;
  std::vector<TensorEntry> submitted_;  // pushed, not yet taken by the loop
  common::Status failure_;              // sticky once set
  std::string abort_reason_;

  // Atomics, any thread.
  std::atomic<bool> has_failure_{false};  // failure_ is set (read without the lock)
  std::atomic<bool> shutdown_requested_{false};
  std::atomic<bool> abort_requested_{false};
  // Note [Caller drives] B: while callers drive, the sleeping loop watches only wake_fd_.
  std::atomic<bool> standby_{false};
  // Note [Wake only a sleeper]: submit() wakes the loop only while it is (about to be)
  // blocked in poll(); otherwise the loop sees submissions_pending_ on its next pass.
  std::atomic<bool> submissions_pending_{false};
  std::atomic<bool> sleeping_{false};
  // Note [Coalesced wakes]: the loop naps (work of its own in flight, back within a cycle);
  // submitters leave it be, a caller about to wait wakes it (waiter_waiting_ is the pair).
  std::atomic<bool> napping_{false};
  std::atomic<bool> waiter_waiting_{false};
};

}  // namespace hvd::runtime
