// Submissions and the lifetime of tensor keys, for BackgroundLoop (background_loop.h):
// framework threads submit() entries (acquiring their keys), the loop drains them into its
// entry table and, now and then, sweeps the keys nothing refers to any more.
#include "common/logging.h"
#include "runtime/background_loop.h"

namespace hvd::runtime {

using common::Status;

Status BackgroundLoop::submit(TensorEntry* entries, const std::string_view* names, size_t count,
                              bool wake) {
  // A failed core answers with its failure, not with a duplicate name: fail() releases every
  // key only after it stored the failure.
  if (queue_.hasFailure()) return failure();
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
    entries[i].handle = handles_.create(/*caller_waits=*/!wake, entries[i].request.key);
  }
  Status refused = queue_.push(entries, count);
  if (!refused.isOk()) {
    for (size_t i = 0; i < count; ++i) handles_.release(entries[i].handle);  // and the names
    return refused;
  }
  if (wake || !drivable_) {
    queue_.wakeIfAsleep();
  } else {
    queue_.markPending();  // the caller's drive() drains it, or the next pass
  }
  return Status::ok();
}

void BackgroundLoop::drainSubmissions() {
  queue_.take(&draining_);  // clears the pending flags (Note [Coalesced wakes])
  drained_recently_ = !draining_.empty();  // Note [Coalesced wakes]
  if (draining_.empty()) return;
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
    if (coordinator_) {
      coordinator_->admit(entry.request.key, entry.request, mesh_.rank(), timeline, now);
    } else {
      outgoing_.push_back(entry.request.key);
    }
  }
  draining_.clear();
  metrics_.setQueueDepth(entries_.size());
}

// Frees the keys of names nothing refers to any more (Note [Key lifetime] in key_table.cc):
// names in flight on this rank are kept by the table itself; here go the other holders.
void BackgroundLoop::sweepKeys() {
  keys_.sweep([this](const coord::KeyTable::MarkFn& mark) {
    if (coordinator_) coordinator_->markKeys(mark);  // its tables, parked and held requests
    for (const auto& work : to_execute_) {
      for (coord::Key key : work.response.keys) mark(key);
    }
    for (coord::Key key : outgoing_) mark(key);
  });
}

}  // namespace hvd::runtime
