// The queue of agreed work (execution_queue.h): responses run in the order rank 0 produced
// them, autotune switches applied at their place, and the connections of each process set.
#include "runtime/execution_queue.h"

#include "common/logging.h"

namespace hvd::runtime {

using common::Status;

ExecutionQueue::ExecutionQueue(transport::Mesh& mesh, ProcessSetTable& sets,
                               const common::Config& config, Metrics& metrics,
                               Executor& executor, const coord::KeyTable& keys,
                               EntryTable& entries, Autotuner* autotuner)
    : mesh_(mesh), sets_(sets), config_(config), metrics_(metrics), executor_(executor),
      keys_(keys), entries_(entries), autotuner_(autotuner) {}

void ExecutionQueue::pushParams(const coord::ParamsUpdate& params) {
  to_execute_.push_back(Work{params, coord::Response()});
}

void ExecutionQueue::push(coord::Response&& response) {
  to_execute_.push_back(Work{std::nullopt, std::move(response)});
}

// Removed process sets leave with their connections (a set's NCCL communicator holds GPU
// memory), once no device work of theirs is in flight.
void ExecutionQueue::dropRemovedSets() {
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

Status ExecutionQueue::run() {
  dropRemovedSets();
  waiting_for_device_ = false;
  while (!to_execute_.empty()) {
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
    if (!status.isOk()) return status;
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
    if (response.process_set == 0 && response.type == coord::OpType::kJoin && status.isOk() &&
        response.status == coord::ResponseType::kOk) {
      ++global_joins_;
    }
    observeExecuted(response, status);
    if (!status.isOk()) return status;
  }
  return Status::ok();
}

Status ExecutionQueue::runOneRound(const coord::Response& response,
                                   const OneRoundInputs& inputs) {
  CommSlot& slot = commFor(0);
  Status status = executor_.execute(response, entries_, *slot.comm, slot.transport, &inputs);
  metrics_.setQueueDepth(entries_.size());
  // Not in global_responses_: an autotune switch's place is counted in rank 0's response order,
  // which board ops are outside of (they finish in any order against it on each rank).
  observeExecuted(response, status);
  return status;
}

ExecutionQueue::CommSlot& ExecutionQueue::commFor(int32_t process_set) {
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

// ---- autotune --------------------------------------------------------------------------------

void ExecutionQueue::applyParams(const coord::ParamsUpdate& update) {
  if (autotuner_ != nullptr) autotuner_->applied(update, global_responses_);
  // The only setting that acts on every rank; fusion, window and cache act on rank 0 alone,
  // which adopted them when it attached this update (RankZeroCoordinator::adoptTunedParams).
  executor_.setHierarchicalAllreduce(update.hierarchical_allreduce);
}

// Rank 0 scores settings by the global set's allreduce bytes per second (Horovod's score).
void ExecutionQueue::observeExecuted(const coord::Response& r, const Status& status) {
  if (autotuner_ == nullptr || mesh_.rank() != 0 || !autotuner_->observing() || !status.isOk() ||
      r.process_set != 0 || r.type != coord::OpType::kAllreduce ||
      r.status != coord::ResponseType::kOk) {
    return;
  }
  const int64_t element = static_cast<int64_t>(common::dataTypeSize(r.dtype));
  for (size_t i = 0; i < r.keys.size(); ++i) {
    autotuner_->observe(keys_.name(r.keys[i]), i < r.counts.size() ? r.counts[i] * element : 0);
  }
}

void ExecutionQueue::markKeys(const coord::KeyTable::MarkFn& mark) const {
  for (const auto& work : to_execute_) {
    for (coord::Key key : work.response.keys) mark(key);
  }
}

}  // namespace hvd::runtime
