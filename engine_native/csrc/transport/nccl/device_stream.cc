// DeviceStream (device_stream.h): thin, checked wrappers over the CUDA runtime table. Every
// call goes through cudaApi(); nothing here includes a CUDA header (DESIGN §3 "Boundary").
#include "transport/nccl/device_stream.h"

#include <algorithm>
#include <string>
#include <thread>

#include "common/logging.h"
#include "common/poll_pacer.h"
#include "transport/nccl/loader.h"
#include "transport/nccl/ordered_memory.h"

namespace hvd::transport::nccl {

using common::Status;

DeviceRestorer::DeviceRestorer() {
  const CudaApi* cuda = cudaApi();
  if (cuda != nullptr && cuda->getDevice(&device_) != kCudaSuccess) device_ = -1;
}

DeviceRestorer::~DeviceRestorer() {
  const CudaApi* cuda = cudaApi();
  int now = -1;
  if (cuda == nullptr || device_ < 0 || cuda->getDevice(&now) != kCudaSuccess) return;
  if (now != device_) cuda->setDevice(device_);
}

DeviceStream::~DeviceStream() {
  if (cuda_ == nullptr) return;
  DeviceRestorer restore;
  if (device_ >= 0) cuda_->setDevice(device_);
  if (stream_ != nullptr && !drain(std::chrono::steady_clock::now() + std::chrono::seconds(2))) {
    HVD_LOG(kWarning, "transport") << "the core's CUDA stream on cuda:" << device_
                                   << " still has work queued after 2 s (a kernel it waits "
                                   << "for does not finish); its buffers stay allocated";
    return;
  }
  for (CudaEvent event : all_events_) cuda_->eventDestroy(event);
  freeRetired();
  if (device_buffer_ != nullptr) cuda_->free(device_buffer_);
  if (host_buffer_ != nullptr) cuda_->freeHost(host_buffer_);
  if (stream_ != nullptr) cuda_->streamDestroy(stream_);
}

Status DeviceStream::check(int error, const char* call) const {
  if (error == kCudaSuccess) return Status::ok();
  const char* text = cuda_ != nullptr ? cuda_->getErrorString(error) : nullptr;
  return common::internalError(std::string("CUDA error in ") + call + " on device " +
                               std::to_string(device_) + ": " +
                               (text != nullptr ? text : "unknown error") + " (code " +
                               std::to_string(error) + ")");
}

Status DeviceStream::init(int device) {
  if (ready()) {
    return device == device_ ? Status::ok()
                             : common::internalError("DeviceStream::init: already on device " +
                                                     std::to_string(device_));
  }
  cuda_ = cudaApi();
  if (cuda_ == nullptr) {
    return common::internalError(
        "the CUDA runtime is not loaded (engine_native.gpu.require_cuda() loads it at the first "
        "CUDA tensor)");
  }
  device_ = device;
  HVD_RETURN_IF_ERROR(check(cuda_->setDevice(device), "cudaSetDevice"));
  return check(cuda_->streamCreateWithFlags(&stream_, kCudaStreamNonBlocking),
               "cudaStreamCreateWithFlags");
}

Status DeviceStream::select() const {
  return check(cuda_->setDevice(device_), "cudaSetDevice");
}

Status DeviceStream::pciBusId(std::string* out) const {
  char bus_id[64] = {0};
  HVD_RETURN_IF_ERROR(check(cuda_->deviceGetPciBusId(bus_id, sizeof(bus_id), device_),
                            "cudaDeviceGetPCIBusId"));
  *out = bus_id;
  return Status::ok();
}

Status DeviceStream::waitFor(CudaEvent event) {
  // The wait captures the event's state now: the caller may re-record it at once.
  return check(cuda_->streamWaitEvent(stream_, event, 0), "cudaStreamWaitEvent");
}

Status DeviceStream::deviceBuffer(size_t bytes, void** out) {
  if (bytes > device_bytes_) {
    void* fresh = nullptr;
    HVD_RETURN_IF_ERROR(
        check(allocateOrdered(*cuda_, stream_, bytes, &fresh), "cudaMallocAsync/cudaMalloc"));
    void* replaced = device_buffer_;
    device_buffer_ = fresh;
    device_bytes_ = bytes;
    // Every user of the old buffer is queued on this stream: a stream-ordered free runs after
    // them; cudaFree (the fallback: Note [Ordered device memory]) waits until it drained.
    if (replaced != nullptr && orderedFrees()) {
      HVD_RETURN_IF_ERROR(check(freeOrdered(*cuda_, stream_, replaced), "cudaFreeAsync"));
    } else if (replaced != nullptr) {
      retired_device_.push_back(replaced);
    }
  }
  *out = device_buffer_;
  return Status::ok();
}

Status DeviceStream::hostBuffer(size_t bytes, void** out) {
  if (bytes > host_bytes_) {
    // cudaFreeHost, which frees a replaced buffer, waits for the device and has no
    // stream-ordered form: powers of two from 1 MiB keep growths few and small ops free of it.
    size_t grown = size_t{1} << 20;
    while (grown < bytes) grown <<= 1;
    void* fresh = nullptr;
    HVD_RETURN_IF_ERROR(check(cuda_->mallocHost(&fresh, grown), "cudaMallocHost"));
    if (host_buffer_ != nullptr) retired_host_.push_back(host_buffer_);
    host_buffer_ = fresh;
    host_bytes_ = grown;
  }
  *out = host_buffer_;
  return Status::ok();
}

void DeviceStream::freeRetired() {
  for (void* p : retired_device_) cuda_->free(p);
  for (void* p : retired_host_) cuda_->freeHost(p);
  retired_device_.clear();
  retired_host_.clear();
}

Status DeviceStream::copy(void* dst, const void* src, size_t bytes) {
  if (bytes == 0 || dst == src) return Status::ok();
  return check(cuda_->memcpyAsync(dst, src, bytes, kCudaMemcpyDefault, stream_),
               "cudaMemcpyAsync");
}

Status DeviceStream::zero(void* dst, size_t bytes) {
  if (bytes == 0) return Status::ok();
  return check(cuda_->memsetAsync(dst, 0, bytes, stream_), "cudaMemsetAsync");
}

Status DeviceStream::synchronize() {
  return check(cuda_->streamSynchronize(stream_), "cudaStreamSynchronize");
}

bool DeviceStream::drain(std::chrono::steady_clock::time_point deadline) {
  return drain(deadline, std::chrono::microseconds(0), {});
}

bool DeviceStream::drain(std::chrono::steady_clock::time_point deadline,
                         std::chrono::microseconds spin, const std::function<bool()>& stop) {
  CudaEvent marker = nullptr;
  if (!record(&marker).isOk()) return false;
  bool finished = false;
  const auto spin_until = std::chrono::steady_clock::now() + spin;
  const common::PollPacer pacer;
  while (query(marker, &finished).isOk() && !finished) {
    const auto now = std::chrono::steady_clock::now();
    if (now >= deadline || (stop && stop())) break;
    if (now < spin_until) {
      std::this_thread::yield();
    } else {
      pacer.nap(deadline);
    }
  }
  release(marker);
  return finished;
}

Status DeviceStream::record(CudaEvent* event) {
  if (free_events_.empty()) {
    CudaEvent fresh = nullptr;
    HVD_RETURN_IF_ERROR(check(cuda_->eventCreateWithFlags(&fresh, kCudaEventDisableTiming),
                              "cudaEventCreateWithFlags"));
    all_events_.push_back(fresh);
    free_events_.push_back(fresh);
  }
  *event = free_events_.back();
  free_events_.pop_back();
  return check(cuda_->eventRecord(*event, stream_), "cudaEventRecord");
}

Status DeviceStream::query(CudaEvent event, bool* finished) const {
  const int error = cuda_->eventQuery(event);
  *finished = error == kCudaSuccess;
  return error == kCudaErrorNotReady ? Status::ok() : check(error, "cudaEventQuery");
}

Status DeviceStream::notify(CudaHostFn fn, void* data) {
  return check(cuda_->launchHostFunc(stream_, fn, data), "cudaLaunchHostFunc");
}

void DeviceStream::release(CudaEvent event) {
  if (event != nullptr) free_events_.push_back(event);
}

}  // namespace hvd::transport::nccl
