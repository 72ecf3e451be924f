// The execution half of BackgroundLoop (background_loop.h): the queue of agreed responses,
// run in the order rank 0 produced them (a staged CUDA op at its head waits, without blocking
// the loop, for its inputs to reach host memory), and the connections of each process set.
#include "common/logging.h"
#include "runtime/background_loop.h"

namespace hvd::runtime {

using common::Status;

// Removed process sets leave with their connections (a set's NCCL communicator holds GPU
// memory), once no device work of theirs is in flight.
void BackgroundLoop::dropRemovedSets() {
  const uint64_t version = sets_.version();
  if (version == comms_version_) return;
  bool all = true;
  for (auto it = comms_.begin(); it != comms_.end();) {
    if (it->first == 0 || sets_.members(it->first)) {
      ++it;
    } else if (executor_.dropProcessSet(it->first)) {
      it = comms_.erase(it);
    } else {
      all = false;
      ++it;
    }
  }
  if (all) comms_version_ = version;
}

void BackgroundLoop::executeQueued() {
  dropRemovedSets();
  waiting_for_device_ = false;
  while (!to_execute_.empty() && !failed_) {
    Work& work = to_execute_.front();
    if (work.params) {
      applyParams(*work.params);
      to_execute_.pop_front();
      continue;
    }
    if (!sets_.contains(work.response.process_set, mesh_.rank())) {
      to_execute_.pop_front();  // not ours (rank 0 coordinates sets it is not part of)
      continue;
    }
    CommSlot& slot = commFor(work.response.process_set);
    bool ready = true;
    Status status = executor_.readyToExecute(work.response, entries_, *slot.comm, &ready);
    if (!status.isOk()) {
      fail(status, /*tell_peers=*/true);
      break;
    }
    if (!ready) {  // a staged CUDA op's inputs are on their way: the driver wakes the loop
      waiting_for_device_ = true;
      break;
    }
    const coord::Response response = std::move(work.response);
    to_execute_.pop_front();
    // The names stay taken until their handles are released (Note [Name lifetime]).
    status = executor_.execute(response, entries_, *slot.comm, slot.transport);
    metrics_.setQueueDepth(entries_.size());
    if (response.process_set == 0) ++global_responses_;
    observeExecuted(response, status);
    if (!status.isOk()) fail(status, /*tell_peers=*/true);
  }
  // Right after executing, before the next drain: a caller's next op cannot look concurrent.
  // Own tensors submitted but not drained yet count too (Note [Batching window]).
  if (coordinator_ && !failed_) {
    coordinator_->noteStepBoundary(!entries_.empty() || !to_execute_.empty() ||
                                   queue_.submissionsPending());
  }
}

BackgroundLoop::CommSlot& BackgroundLoop::commFor(int32_t process_set) {
  auto it = comms_.find(process_set);
  if (it == comms_.end()) {
    auto members = sets_.members(process_set).value_or(std::vector<int>{});  // once per set
    CommSlot slot;
    slot.transport = "SHM";
    for (int r : members) {
      transport::Pair* pair = mesh_.pair(r);
      if (pair != nullptr && pair->kind() != transport::PairKind::kShm) slot.transport = "TCP";
    }
    slot.comm = std::make_unique<transport::Comm>(mesh_, std::move(members),
                                                  config_.timeout_seconds,
                                                  config_.spin_microseconds);
    it = comms_.emplace(process_set, std::move(slot)).first;
  }
  return it->second;
}

}  // namespace hvd::runtime
