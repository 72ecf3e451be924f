// DeviceExecutor (device_executor.h): sets, streams, deferred completion and abort. The op
// bodies are in device_nccl_ops.cc and device_staged_ops.cc, the path choice in device_path.cc.
#include "runtime/device_executor.h"

#include <unistd.h>

#include <algorithm>
#include <thread>

#include "common/logging.h"
#include "runtime/device_output_pool.h"
#include "runtime/device_path.h"
#include "transport/nccl/loader.h"

namespace hvd::runtime {

namespace nccl = transport::nccl;
using common::Status;
using Clock = std::chrono::steady_clock;

// Note [Deferred completion]: an op's stream work (waits on the producers' events, copies,
// the NCCL call) is only queued when its method returns; queueCompletion() records an event
// after it and queues a host function that writes the loop's eventfd once the stream reaches
// it. The loop, woken, calls poll(): events that fired complete their handles, in queue
// order. No thread blocks on the device on this path (the staged path waits for its own
// copies, Note [Staged fallback]). The host function may run after the loop is gone (a
// shutdown while the stream drains): it holds its own reference to a duplicate of the fd.
class HostWake {
 public:
  explicit HostWake(int fd) : fd_(::dup(fd)) {}
  ~HostWake() {
    if (fd_ >= 0) ::close(fd_);
  }
  HostWake(const HostWake&) = delete;
  HostWake& operator=(const HostWake&) = delete;
  void wake() const {
    const uint64_t one = 1;
    ssize_t rc = ::write(fd_, &one, sizeof(one));
    (void)rc;  // EAGAIN: the counter is already non-zero, the loop wakes anyway
  }

 private:
  int fd_;
};

namespace {

void wakeFromDriver(void* data) {
  auto* keep = static_cast<std::shared_ptr<HostWake>*>(data);
  (*keep)->wake();
  delete keep;
}

void giveBackOutput(OutputBuffer& buffer) {  // Note [Output reuse] in device_output_pool.cc
  DeviceOutputPool::instance().give(buffer.device, buffer.data, buffer.capacity,
                                    buffer.release_stream);
}

const char* pathName(const PathChoice& choice) {
  return choice.nccl ? "nccl" : choice.ipc ? "cuda-ipc" : choice.mixed ? "cuda-ipc+nccl"
                                                                      : "staged";
}

}  // namespace

DeviceExecutor::DeviceExecutor(Metrics& metrics, const common::Config& config, int wake_fd)
    : metrics_(metrics), config_(config), wake_(std::make_shared<HostWake>(wake_fd)) {}

DeviceExecutor::~DeviceExecutor() {
  if (!in_flight_.empty() || staging_.queued) {
    std::vector<DeviceCompletion> dropped;
    abort(&dropped, /*core_failed=*/true);  // the loop completed their handles already
  }
  sets_.clear();     // communicators first: they queue on the streams
  streams_.clear();  // each drains, then frees its buffers and events
}

int DeviceExecutor::localDevice(const OpContext& op) const {
  for (const TensorEntry* e : op.entries) {
    if (e != nullptr) return e->request.device;
  }
  // This rank joined: its zeros live on the set's GPU, else where join(device=...) said.
  auto it = sets_.find(op.response.process_set);
  if (it != sets_.end()) return it->second.device;
  return join_device_;
}

Status DeviceExecutor::prepare(OpContext& op) {
  const int device = localDevice(op);
  if (device < 0) {
    return common::invalidArgument(
        "rank " + std::to_string(op.comm.globalRank(op.comm.rank())) + " joined with "
        "join(device=-1) before running a CUDA op, and the other ranks reduce CUDA tensors: "
        "its zeros need a GPU; call join(device=<cuda ordinal>) there");
  }
  for (const TensorEntry* e : op.entries) {  // a fused batch: every tensor on that GPU
    if (e != nullptr && e->request.device != device) {
      return common::internalError("a batch of CUDA tensors spans cuda:" +
                                   std::to_string(device) + " and cuda:" +
                                   std::to_string(e->request.device) +
                                   "; keep each rank's tensors on one GPU");
    }
  }
  auto& slot = streams_[device];
  if (!slot) {
    slot = std::make_unique<nccl::DeviceStream>();
    Status status = slot->init(device);
    if (!status.isOk()) {
      streams_.erase(device);
      return status;
    }
  }
  current_.stream = slot.get();
  HVD_RETURN_IF_ERROR(current_.stream->select());
  auto it = sets_.find(op.response.process_set);
  if (it == sets_.end()) {
    HVD_RETURN_IF_ERROR(setUp(op, device));
    it = sets_.find(op.response.process_set);
  } else if (it->second.device != device) {
    return common::internalError(
        "process set " + std::to_string(op.response.process_set) + ": this rank's CUDA "
        "tensors of one process set must stay on one GPU (cuda:" +
        std::to_string(it->second.device) + " first, cuda:" + std::to_string(device) +
        " now); move them to one device");
  }
  current_.set = &it->second;
  return waitForInputs(op);
}

Status DeviceExecutor::setUp(OpContext& op, int device) {
  PathChoice choice;
  HVD_RETURN_IF_ERROR(choosePath(op.comm, *current_.stream, config_.gpu_path,
                                 config_.ipc_order == "host", &choice));
  DeviceSet set;
  set.device = device;
  set.path = choice.nccl    ? Path::kNccl
             : choice.ipc  ? Path::kIpc
             : choice.mixed ? Path::kMixed
                            : Path::kStaged;
  set.nccl = std::move(choice.communicator);
  set.ipc = std::move(choice.peers);
  set.gpu_comm = std::move(choice.gpu_comm);
  set.leader = choice.leader;
  const int32_t id = op.response.process_set;
  if (choice.nccl) {
    HVD_LOG(kInfo, "transport") << "process set " << id << ": CUDA collectives via NCCL on cuda:"
                                << device;
  } else if (choice.mixed) {
    HVD_LOG(kInfo, "transport") << "process set " << id << ": CUDA allreduce via CUDA IPC among "
                                << "the " << set.gpu_comm->size() << " ranks on cuda:" << device
                                << ", then NCCL among one rank per GPU; other CUDA collectives "
                                << "stage through host memory";
  } else if (choice.ipc) {
    HVD_LOG(kInfo, "transport") << "process set " << id << ": CUDA collectives via CUDA IPC "
                                << "between the " << op.comm.size() << " ranks sharing cuda:"
                                << device << ", reductions on the device";
  } else {
    HVD_LOG(kWarning, "transport") << "process set " << id << ": CUDA collectives take the "
                                   << "staged path through host memory (slower): "
                                   << choice.why;
  }
  metrics_.setDevicePath(id, pathName(choice), device);
  sets_.emplace(id, std::move(set));
  return Status::ok();
}

// Note [Stream ordering] in transport/nccl/device_stream.h: each input's producer event was
// recorded at enqueue; the stream waits for them here, on the device.
Status DeviceExecutor::waitForInputs(const OpContext& op) {
  for (TensorEntry* e : op.entries) {
    if (e == nullptr || e->ready.get() == nullptr) continue;
    HVD_RETURN_IF_ERROR(stream().waitFor(e->ready.get()));
    e->ready.reset();
  }
  return Status::ok();
}

// Note [Scaling without kernels] in communicator.h: what NCCL cannot reduce is staged.
bool DeviceExecutor::ncclCannotReduce(const OpContext& op, double scale) const {
  return !nccl::ncclCanReduce(*nccl::ncclApi(), op.response.dtype, op.response.reduce_op, scale);
}

Status DeviceExecutor::deviceOutput(size_t bytes, OpResult* result) {
  void* data = nullptr;
  size_t capacity = 0;
  if (bytes > 0) {
    HVD_RETURN_IF_ERROR(DeviceOutputPool::instance().take(bytes, stream(), &data, &capacity));
  }
  result->buffer = std::make_shared<OutputBuffer>(static_cast<uint8_t*>(data), bytes,
                                                  stream().device(), capacity, &giveBackOutput);
  return Status::ok();
}

Status DeviceExecutor::notifyLoop() {
  auto* keep = new std::shared_ptr<HostWake>(wake_);
  Status status = stream().notify(&wakeFromDriver, keep);
  if (!status.isOk()) delete keep;
  return status;
}

bool DeviceExecutor::stagesThroughHost(const OpContext& op) const {
  const coord::Response& r = op.response;
  const bool reduction = r.type == coord::OpType::kAllreduce ||
                         r.type == coord::OpType::kReducescatter;
  if (current_.set->path == Path::kStaged) return true;
  if (!reduction && current_.set->path != Path::kMixed) return false;
  if (current_.set->path == Path::kIpc) return r.reduce_op == common::ReduceOp::kAdasum;
  if (current_.set->path == Path::kMixed) {  // Note [Device path choice], E
    const common::ReduceOp across = r.reduce_op == common::ReduceOp::kAverage
                                        ? common::ReduceOp::kSum : r.reduce_op;
    return r.type != coord::OpType::kAllreduce ||
           !nccl::ncclCanReduce(*nccl::ncclApi(), r.dtype, across, 1.0);
  }
  return ncclCannotReduce(op, r.prescale * r.postscale);
}

Status DeviceExecutor::inputsReady(OpContext& op, bool* ready) {
  *ready = true;
  if (stagesThroughHost(op)) return stageInputs(op, ready);
  if (current_.set->path == Path::kIpc && ipc().hostOrdered()) return awaitProducers(op, ready);
  return Status::ok();
}

Status DeviceExecutor::queueCompletion(DeviceCompletion completion) {
  InFlight item;
  item.stream = current_.stream;
  HVD_RETURN_IF_ERROR(item.stream->record(&item.done));
  Status status = notifyLoop();
  if (!status.isOk()) {
    item.stream->release(item.done);
    return status;
  }
  if (in_flight_.empty()) progress_at_ = Clock::now();
  item.completion = std::move(completion);
  in_flight_.push_back(std::move(item));
  return Status::ok();
}

bool DeviceExecutor::dropProcessSet(int32_t id) {
  auto it = sets_.find(id);
  if (it == sets_.end()) return true;
  if (busy()) return false;  // its communicator may still have work queued
  sets_.erase(it);
  return true;
}

Status DeviceExecutor::poll(std::vector<DeviceCompletion>* done) {
  const auto now = Clock::now();
  if (staging_.queued && now - staging_.since > std::chrono::duration<double>(
                                                     config_.timeout_seconds)) {
    return common::timedOut("a CUDA op waited for its inputs' producers (or their copy to "
                            "host memory) for HVD_TIMEOUT=" +
                            std::to_string(config_.timeout_seconds) +
                            " s: a kernel that produces them never finishes");
  }
  if (in_flight_.empty()) return Status::ok();
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    bool finished = false;
    HVD_RETURN_IF_ERROR(it->stream->query(it->done, &finished));
    if (!finished) {
      ++it;
      continue;
    }
    it->stream->release(it->done);
    done->push_back(std::move(it->completion));
    it = in_flight_.erase(it);
    progress_at_ = now;
  }
  if (in_flight_.empty()) {
    for (auto& [device, stream] : streams_) stream->freeRetired();  // nothing queued uses them
    return Status::ok();
  }
  return checkTimeout(now);
}

// A collective that waits on a peer forever shows as an event that never fires; NCCL may
// know why (ncclCommGetAsyncError).
Status DeviceExecutor::checkTimeout(Clock::time_point now) {
  for (auto& [id, set] : sets_) {
    if (set.nccl) HVD_RETURN_IF_ERROR(set.nccl->asyncError());
  }
  const double waited = std::chrono::duration<double>(now - progress_at_).count();
  if (waited < config_.timeout_seconds) return Status::ok();
  return common::timedOut("a CUDA collective made no progress for " +
                         std::to_string(static_cast<int>(waited)) + " s (HVD_TIMEOUT=" +
                         std::to_string(config_.timeout_seconds) + "): a peer stopped taking "
                         "part, or a kernel it waits for never finishes");
}

void DeviceExecutor::abort(std::vector<DeviceCompletion>* all, bool core_failed) {
  if (!core_failed && in_flight_.empty() && !staging_.queued) return;
  for (auto& [id, set] : sets_) {
    if (set.nccl) set.nccl->abort();
  }
  // Users' tensors may still be written by queued copies: give the streams a short, bounded
  // time to drain before the handles complete (an aborted collective returns at once; work
  // behind a producer that never finishes will not drain, and every rank must fail within
  // HVD_TIMEOUT).
  const auto give_up = Clock::now() + std::chrono::milliseconds(
      static_cast<int64_t>(std::min(1.0, config_.timeout_seconds / 4) * 1000));
  if (staging_.queued) {  // copies that only read users' tensors: no need to wait for them
    staging_.stream->release(staging_.event);
    staging_ = Staging();
  }
  for (InFlight& item : in_flight_) {
    bool finished = false;
    while (item.stream->query(item.done, &finished).isOk() && !finished &&
           Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!finished) {
      HVD_LOG(kWarning, "transport") << "a CUDA collective still runs after abort; its "
                                     << "handles complete anyway";
    }
    item.stream->release(item.done);
    all->push_back(std::move(item.completion));
  }
  in_flight_.clear();
}

}  // namespace hvd::runtime
