#include "runtime/ready_events.h"

#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "transport/nccl/loader.h"

namespace hvd::runtime {

namespace nccl = transport::nccl;
using common::Status;

namespace {

Status cudaFailure(const nccl::CudaApi& cuda, int error, const char* call, int device) {
  const char* text = cuda.getErrorString(error);
  return common::internalError(std::string("CUDA error in ") + call + " on device " +
                               std::to_string(device) + ": " + (text ? text : "unknown") +
                               " (code " + std::to_string(error) + ")");
}

class EventPool {
 public:
  // The caller made `device` current: an event belongs to the device current at its creation.
  Status take(const nccl::CudaApi& cuda, int device, nccl::CudaEvent* out) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      std::vector<nccl::CudaEvent>& free = free_[device];
      if (!free.empty()) {
        *out = free.back();
        free.pop_back();
        return Status::ok();
      }
    }
    const int error = cuda.eventCreateWithFlags(out, nccl::kCudaEventDisableTiming);
    if (error != nccl::kCudaSuccess) {
      return cudaFailure(cuda, error, "cudaEventCreateWithFlags", device);
    }
    return Status::ok();
  }
  void give(int device, nccl::CudaEvent event) {
    std::lock_guard<std::mutex> lock(mutex_);
    free_[device].push_back(event);
  }

 private:
  std::mutex mutex_;
  std::map<int, std::vector<nccl::CudaEvent>> free_;
};

// Never destroyed: at process exit the CUDA runtime may already be gone.
EventPool& pool() {
  static EventPool* instance = new EventPool();
  return *instance;
}

}  // namespace

ReadyEvent& ReadyEvent::operator=(ReadyEvent&& other) noexcept {
  if (this != &other) {
    reset();
    event_ = other.event_;
    device_ = other.device_;
    other.event_ = nullptr;
  }
  return *this;
}

Status ReadyEvent::record(int device, nccl::CudaStream producer) {
  reset();
  const nccl::CudaApi* cuda = nccl::cudaApi();
  if (cuda == nullptr) {
    return common::invalidArgument(
        "a CUDA tensor reached the core before the CUDA runtime was loaded; "
        "engine_native.gpu.require_cuda() loads it (engine_native.torch calls it for you)");
  }
  // The tensor's device is current for the call (stream 0 is the legacy stream of the
  // current device), and the framework thread gets its own device back afterwards.
  int previous = -1;
  int error = cuda->getDevice(&previous);
  if (error != nccl::kCudaSuccess) return cudaFailure(*cuda, error, "cudaGetDevice", device);
  if (previous != device && (error = cuda->setDevice(device)) != nccl::kCudaSuccess) {
    return cudaFailure(*cuda, error, "cudaSetDevice", device);
  }
  nccl::CudaEvent event = nullptr;
  Status status = pool().take(*cuda, device, &event);
  if (status.isOk()) {
    error = cuda->eventRecord(event, producer);
    if (error != nccl::kCudaSuccess) {
      pool().give(device, event);
      status = cudaFailure(*cuda, error, "cudaEventRecord", device);
    }
  }
  if (previous != device) cuda->setDevice(previous);
  HVD_RETURN_IF_ERROR(status);
  event_ = event;
  device_ = device;
  return Status::ok();
}

void ReadyEvent::reset() {
  if (event_ == nullptr) return;
  pool().give(device_, event_);
  event_ = nullptr;
}


Status refuseGraphCapture(uintptr_t stream, std::string_view what) {
  const nccl::CudaApi* cuda = nccl::cudaApi();
  if (cuda == nullptr) return Status::ok();
  int capture = nccl::kCudaStreamCaptureStatusNone;
  const int rc = cuda->streamIsCapturing(reinterpret_cast<nccl::CudaStream>(stream), &capture);
  const bool capturing = rc == nccl::kCudaErrorStreamCaptureImplicit ||
                         (rc == nccl::kCudaSuccess &&
                          capture != nccl::kCudaStreamCaptureStatusNone);
  if (!capturing) return Status::ok();
  return common::invalidArgument(
      std::string(what) + ": the tensor's CUDA stream is capturing a CUDA graph "
      "(torch.cuda.graph); an hvd op cannot be captured, because the core runs it on its own "
      "thread and streams, outside any replay. Run hvd ops outside the captured region: capture "
      "the forward and backward passes, then allreduce the gradients (or step the "
      "DistributedOptimizer) after graph.replay()");
}

}  // namespace hvd::runtime
