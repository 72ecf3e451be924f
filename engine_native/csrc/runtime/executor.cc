#include "runtime/executor.h"

#include <algorithm>
#include <chrono>
#include <optional>

#include "common/logging.h"

namespace hvd::runtime {

using common::Status;
using coord::OpType;

namespace {

double elapsedSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

Executor::Executor(HandleTable& handles, Metrics& metrics, const common::Config& config,
                   timeline::Timeline* timeline, const coord::KeyTable& keys, int wake_fd)
    : handles_(handles), metrics_(metrics), config_(config), timeline_(timeline), keys_(keys),
      wake_fd_(wake_fd), cpu_(metrics, config), hierarchical_(config.hierarchical_allreduce) {}

Executor::~Executor() = default;

// ---- timeline ----------------------------------------------------------------------------
// Note [Timeline detail]: while a timeline file is written (rank 0), every name of a response
// gets the same spans, as Horovod's *All calls do: <OP> with dtype/shape, its activities, the
// end. Otherwise only the in-memory strip listens, which draws collectives: one <OP> span per
// response, under its first name ("name (+k fused)" for a fused batch), no activities. That
// keeps an always-on strip at two records per batch instead of ~10 per tensor.

void Executor::recordStart(const coord::Response& r, const std::vector<TensorEntry*>& entries) {
  detailed_now_ = recording() && detailed_.load(std::memory_order_relaxed);
  if (!recording() || r.type == OpType::kJoin || r.keys.empty()) return;
  const char* op = coord::opTypeName(r.type);
  if (!detailed_now_) {
    summary_ = keys_.name(r.keys[0]);
    if (r.keys.size() > 1) summary_ += " (+" + std::to_string(r.keys.size() - 1) + " fused)";
    const coord::Shape* dims = entries[0] != nullptr ? &entries[0]->request.shape : nullptr;
    timeline_->start(summary_, op, r.dtype, dims ? dims->data() : nullptr, dims ? dims->size() : 0);
    return;
  }
  timeline_->beginGroup(op);  // Note [Response groups] in timeline.cc
  for (size_t i = 0; i < r.keys.size(); ++i) {
    if (entries[i] != nullptr) {
      const coord::Shape& dims = entries[i]->request.shape;
      timeline_->start(keys_.name(r.keys[i]), op, r.dtype, dims.data(), dims.size());
      continue;
    }
    const int64_t zeros = i < r.counts.size() ? r.counts[i] : 0;  // a joined rank's zeros
    timeline_->start(keys_.name(r.keys[i]), op, r.dtype, &zeros, 1);
  }
}

void Executor::start(const char* activity) {
  if (!detailed_now_ || current_ == nullptr || current_->keys.empty()) return;
  timeline_->activityStartGroup(activity[0] == '_' ? transport_ + activity : activity);
}

void Executor::end() {
  if (detailed_now_ && current_ != nullptr && !current_->keys.empty()) {
    timeline_->activityEndGroup();
  }
}

void Executor::recordEnd(const coord::Response& r, const std::string& error) {
  if (!recording() || r.type == OpType::kJoin) return;
  if (r.status == coord::ResponseType::kError) {
    for (coord::Key key : r.keys) timeline_->end(keys_.name(key), error);  // errors: every name
  } else if (detailed_now_) {
    timeline_->endGroup(error);
  } else if (!r.keys.empty()) {
    timeline_->end(summary_, error);
  }
}

// The spans a device op leaves open when its stream work is queued; they end when it completes.
std::vector<std::string> Executor::openSpans(const coord::Response& r) const {
  std::vector<std::string> names;
  if (!recording() || r.keys.empty()) return names;
  if (!detailed_now_) {
    names.push_back(summary_);
    return names;
  }
  for (coord::Key key : r.keys) names.push_back(keys_.name(key));
  return names;
}

// Completes the handles of the response being executed, all under one lock, and removes their
// entries (after the handles: a caller may resubmit a name only once its wait returned).
// A fused allgather's keys each get their own output (key_results_, filled by the executor on
// success); every other response completes its handles with the one result.
void Executor::complete(const Status& status, const OpResult& result) {
  const bool each = status.isOk() && !key_results_.empty() &&
                    key_results_.size() == done_handles_.size();
  handles_.completeMany(done_handles_.data(), done_handles_.size(), status, result,
                        each ? key_results_.data() : nullptr);
}

// A response is on the device when its tensors are: this rank's entry says so, or — for a
// joined rank, which has none — rank 0's (every rank agreed on CPU vs GPU in negotiation).
OpExecutor& Executor::implementationFor(const coord::Response& r, TensorEntry* first) {
  const int device = first != nullptr ? first->request.device : r.device;
  if (device < 0) return cpu_;
  if (!device_) {
    device_ = std::make_unique<DeviceExecutor>(metrics_, config_, wake_fd_);
    device_->noteJoinDevice(join_device_);
  }
  return *device_;
}

Status Executor::run(OpContext& op, TensorEntry* first) {
  const coord::Response& r = op.response;
  if (r.type == OpType::kBarrier) {
    start("_BARRIER");
    Status status = algo::barrier(op.comm);
    end();
    return status;
  }
  if (r.type == OpType::kJoin) {
    op.result->last_joined_rank = r.last_joined_rank;
    return Status::ok();
  }
  OpExecutor& impl = implementationFor(r, first);
  if (&impl == device_.get()) HVD_RETURN_IF_ERROR(device_->prepare(op));
  switch (r.type) {
    case OpType::kAllreduce: return impl.allreduce(op);
    case OpType::kAllgather: return impl.allgather(op);
    case OpType::kBroadcast: return impl.broadcast(op);
    case OpType::kAlltoall: return impl.alltoall(op);
    case OpType::kReducescatter: return impl.reducescatter(op);
    default: return Status::ok();
  }
}

void Executor::lookUp(const coord::Response& r, EntryTable& table) {
  entries_.assign(r.keys.size(), nullptr);
  done_handles_.clear();
  for (size_t i = 0; i < r.keys.size(); ++i) {
    entries_[i] = table.find(r.keys[i]);  // nullptr: joined rank, contributes zeros
    if (entries_[i] != nullptr) done_handles_.push_back(entries_[i]->handle);
  }
}

Status Executor::readyToExecute(const coord::Response& r, EntryTable& table,
                                transport::Comm& comm, bool* ready) {
  *ready = true;
  if (r.status == coord::ResponseType::kError || r.type == OpType::kBarrier ||
      r.type == OpType::kJoin) {
    return Status::ok();
  }
  lookUp(r, table);
  TensorEntry* first = entries_.empty() ? nullptr : entries_[0];
  if (&implementationFor(r, first) != device_.get()) return Status::ok();
  transport::nccl::DeviceRestorer restore;  // this may be a framework thread (caller drives)
  const auto choice = algo::AllreduceChoice::fromConfig(config_, hierarchicalAllreduce());
  OpResult unused;
  OpContext op{r, entries_, comm, *this, choice, &unused};
  Status status = device_->prepare(op);
  if (status.isOk()) status = device_->inputsReady(op, ready);
  if (!status.isOk() && refine_) status = refine_(status);  // as execute() does
  return status;
}

Status Executor::execute(const coord::Response& r, EntryTable& table, transport::Comm& comm,
                         const std::string& transport, const OneRoundInputs* one_round) {
  struct Executing {
    bool& flag;
    explicit Executing(bool& f) : flag(f) { flag = true; }
    ~Executing() { flag = false; }
  } executing(executing_);
  transport_ = transport;
  lookUp(r, table);
  Status status;
  OpResult result;
  key_results_.clear();
  if (r.status == coord::ResponseType::kError) {
    metrics_.setLastError(r.error);
    recordEnd(r, r.error);  // an ERROR tick per name (the negotiation span already closed)
    status = common::mismatch(r.error);
    complete(status, result);
    for (coord::Key key : r.keys) table.erase(key);
    return Status::ok();
  }
  TensorEntry* first = entries_.empty() ? nullptr : entries_[0];
  current_ = &r;
  recordStart(r, entries_);
  metrics_.beginOp(coord::opTypeName(r.type), r.keys.empty() ? "" : keys_.name(r.keys[0]));
  auto t0 = std::chrono::steady_clock::now();
  const auto choice = algo::AllreduceChoice::fromConfig(config_, hierarchicalAllreduce());
  key_results_.clear();
  OpContext op{r, entries_, comm, *this, choice, &result, &key_results_, one_round};
  // A join or a barrier carries no tensor, whatever device join(device=...) named.
  const bool on_device = r.type != OpType::kJoin && r.type != OpType::kBarrier &&
                         (first != nullptr ? first->request.device >= 0 : r.device >= 0);
  std::optional<transport::nccl::DeviceRestorer> restore;  // the thread may be a framework's
  if (on_device) restore.emplace();
  status = run(op, first);
  if (status.isOk() && on_device) {
    const bool caller_polls = std::find(done_handles_.begin(), done_handles_.end(),
                                        awaited_handle_) != done_handles_.end();
    status = device_->queueCompletion(DeviceCompletion{done_handles_, std::move(result),
                                                       openSpans(r), Status::ok(), caller_polls});
    if (status.isOk() && caller_polls) caller_polled_.fetch_add(1, std::memory_order_release);
  }
  metrics_.addCommunicate(elapsedSince(t0));
  metrics_.endOp();
  current_ = nullptr;
  if (!status.isOk() && refine_) status = refine_(status);
  if (!status.isOk()) metrics_.setLastError(status.message());
  if (!status.isOk() || !on_device) {
    recordEnd(r, status.isOk() ? std::string() : status.message());
    complete(status, result);
  }
  for (coord::Key key : r.keys) table.erase(key);
  return status;
}

bool Executor::dropProcessSet(int32_t id) { return !device_ || device_->dropProcessSet(id); }

void Executor::noteJoinDevice(int device) {
  join_device_ = device;
  if (device_) device_->noteJoinDevice(device);
}

void Executor::finishDevice(std::vector<DeviceCompletion>& done) {
  for (DeviceCompletion& c : done) {
    if (recording()) {
      for (const std::string& name : c.timeline_names) timeline_->end(name, c.status.message());
    }
    handles_.completeMany(c.handles.data(), c.handles.size(), c.status, c.result);
    if (c.caller_polls) caller_polled_.fetch_sub(1, std::memory_order_release);
  }
  done.clear();
}

Status Executor::pollDevice() {
  if (!device_ || !device_->busy()) return Status::ok();
  Status status = device_->poll(&finished_);
  finishDevice(finished_);
  return status;
}

void Executor::failDevice(const Status& status) {
  if (!device_) return;
  device_->abort(&finished_, status.code() != common::Code::kShutDown);
  for (DeviceCompletion& c : finished_) c.status = status;
  if (!status.isOk()) metrics_.setLastError(status.message());
  finishDevice(finished_);
}

}  // namespace hvd::runtime
