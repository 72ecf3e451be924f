// The framework-thread side of BackgroundLoop (submission_queue.h): submissions (and the keys
// of their names), the sticky failure, shutdown and abort requests, and the wake protocol
// between submitters and the sleeping loop.
#include "runtime/submission_queue.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

namespace hvd::runtime {

using common::Status;

SubmissionQueue::SubmissionQueue(HandleTable& handles, coord::KeyTable& keys)
    : handles_(handles), keys_(keys), wake_fd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {}

SubmissionQueue::~SubmissionQueue() {
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

Status SubmissionQueue::submit(TensorEntry* entries, const std::string_view* names, size_t count,
                               bool caller_waits, bool wake) {
  // A failed core answers with its failure, not with a duplicate name: the loop's fail()
  // releases every key only after it stored the failure (failAll).
  if (hasFailure()) return failure();
  // Keys first (their own lock): acquiring one is the duplicate-name check. The entries keep
  // only the key; the name lives in keys_.
  for (size_t i = 0; i < count; ++i) {
    coord::Request& r = entries[i].request;
    const auto acquired = keys_.acquire(r.process_set, names[i], &r.key);
    if (acquired == coord::KeyTable::Acquired::kOk) continue;
    for (size_t j = 0; j < i; ++j) keys_.release(&entries[j].request.key, 1);
    const std::string what =
        std::string(coord::opTypeName(r.type)) + "('" + std::string(names[i]) + "')";
    if (acquired == coord::KeyTable::Acquired::kFull) {
      return common::internalError(what + ": more than 4 Mi tensors are in flight; wait for "
                                   "some of them first");
    }
    // ValueError with Horovod's wording (its DUPLICATE_NAME_ERROR), which user code may match;
    // raised every time until the first op's handle is synchronized (Note [Name lifetime]).
    return common::invalidArgument(
        what + ": requested a tensor with the same name as another tensor that is "
               "currently being processed (already in flight: its handle has not been "
               "synchronized yet). Synchronize it (synchronize()/wait(), or poll() until True) "
               "before reusing the name, or use a different tensor name");
  }
  // Each handle holds its entry's name from here on (Note [Name lifetime] in handle_table.h).
  // submit() moves the entries on; their handle fields (plain integers) keep their values.
  for (size_t i = 0; i < count; ++i) {
    entries[i].handle = handles_.create(caller_waits, entries[i].request.key);
    entries[i].caller_waits = caller_waits;
    entries[i].grouped = count > 1;
  }
  Status refused = push(entries, count);
  if (!refused.isOk()) {
    for (size_t i = 0; i < count; ++i) handles_.release(entries[i].handle);  // and the names
    return refused;
  }
  if (wake) {
    wakeIfAsleep();
  } else {
    submissions_pending_.store(true);  // the caller's drive() drains it, or the next pass
  }
  return Status::ok();
}

Status SubmissionQueue::push(TensorEntry* entries, size_t count) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!failure_.isOk()) return failure_;
  if (shutdown_requested_) return Status(common::Code::kShutDown, "Horovod has been shut down");
  for (size_t i = 0; i < count; ++i) submitted_.push_back(std::move(entries[i]));
  return Status::ok();
}

Status SubmissionQueue::failure() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return failure_;
}

std::string SubmissionQueue::abortReason() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return abort_reason_;
}

void SubmissionQueue::requestShutdown() {
  shutdown_requested_ = true;
  standby_.store(false);
  wake();
}

void SubmissionQueue::requestAbort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    abort_reason_ = reason;
  }
  abort_requested_ = true;
  standby_.store(false);
}

void SubmissionQueue::wake() {
  uint64_t one = 1;
  ssize_t rc = ::write(wake_fd_, &one, sizeof(one));
  (void)rc;  // EAGAIN means the counter is already non-zero: the loop will wake anyway
}

// Note [Wake only a sleeper]: a Dekker pair (both sides seq_cst). submit() stores
// submissions_pending_ then reads sleeping_ (here); the loop's beginSleep() stores sleeping_
// then reads submissions_pending_. At least one side sees the other's store, so either the
// loop skips its blocking poll or the submitter writes wake_fd_: a submission is never left
// unseen, and a busy loop costs a submitter no syscall. The submitter that wakes the sleeper
// also clears sleeping_, so one sleep costs one write: a woken loop waiting for a core (this
// machine runs two threads per rank on two cores) still looks asleep until it runs, and most
// of a step's 200 submissions wrote wake_fd_ again (the writes counted before and after:
// benchmarks/history/RESULTS-parts-1-10.md, "Session 4, later": "One wake per sleep").
void SubmissionQueue::wakeIfAsleep() {
  standby_.store(false);
  submissions_pending_.store(true);
  if (sleeping_.exchange(false)) wake();
}

// Note [Coalesced wakes]: while submissions keep coming (its last pass took some) and the loop
// has work of its own in flight (tensors negotiating, a batch held), it sleeps at most one
// cycle (HVD_CYCLE_TIME_MS) and is not woken by submissions: they are drained on its next
// pass — a peer's message, the window timer, the nap's end, or a caller about to wait on a
// handle (wakeForWaiter). A pass that takes nothing ends the naps: a rank waiting on a slow
// peer (a barrier, the shutdown agreement) sleeps until a message or its tick, as an idle
// rank does, instead of waking every cycle. A backward pass submits its gradients in quick
// succession; waking for each cost every rank about a sleep/wake cycle per gradient, and CPU on
// the cores the backward pass needs (wake-ups and CPU per step, before and after:
// benchmarks/history/RESULTS-parts-1-10.md, "Session 6": "Coalesced wakes"). A lone tensor
// is never delayed: with nothing in flight the loop sleeps as before and the first submission
// wakes it. A Dekker pair as in Note [Wake only a sleeper]: the waiter stores waiter_waiting_
// then reads napping_; the loop stores napping_ then reads waiter_waiting_ (and
// submissions_pending_).
// (BackgroundLoop::waitForWork decides between nap and sleep.)
void SubmissionQueue::wakeForWaiter() {
  waiter_waiting_.store(true);
  if (napping_.exchange(false)) wake();
}

void SubmissionQueue::take(std::vector<TensorEntry>* out) {
  std::lock_guard<std::mutex> lock(mutex_);
  submissions_pending_.store(false);  // under the lock: a later push() sets it again
  waiter_waiting_.store(false);  // its submissions are taken now (Note [Coalesced wakes])
  out->swap(submitted_);
}

void SubmissionQueue::failAll(const Status& status, bool store_failure) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (store_failure) {
    failure_ = status;
    has_failure_.store(true, std::memory_order_release);
  }
  for (auto& e : submitted_) handles_.complete(e.handle, status);
  submitted_.clear();
}

int64_t SubmissionQueue::beginSleep(int64_t timeout_us, int64_t nap_us) {
  if (nap_us > 0) {  // Note [Coalesced wakes]
    napping_.store(true);
    if (waiter_waiting_.load() && submissions_pending_.load()) nap_us = 0;
    return std::min<int64_t>(timeout_us, nap_us);
  }
  sleeping_.store(true);  // Note [Wake only a sleeper]
  return submissions_pending_.load() ? 0 : timeout_us;
}

void SubmissionQueue::endSleep() {
  sleeping_.store(false);
  napping_.store(false);
}

void SubmissionQueue::consumeWake() {
  uint64_t value = 0;
  ssize_t n = ::read(wake_fd_, &value, sizeof(value));
  (void)n;
}

void SubmissionQueue::park(int64_t quantum_us, const std::function<bool()>& keep) {
  pollfd wake{wake_fd_, POLLIN, 0};
  while (true) {
    const int64_t us = beginSleep(quantum_us, 0);
    const bool stay = us > 0 && keep();  // asked once the sleep is announced: no wake is lost
    const timespec quantum{static_cast<time_t>(us / 1000000),
                           static_cast<long>(us % 1000000) * 1000};
    const bool woken = stay && ::ppoll(&wake, 1, &quantum, nullptr) > 0;
    endSleep();
    if (woken) consumeWake();
    if (!stay || woken) return;
  }
}

}  // namespace hvd::runtime
