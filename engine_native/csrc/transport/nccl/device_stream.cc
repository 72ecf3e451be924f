// DeviceStream (device_stream.h): thin, checked wrappers over the CUDA runtime table. Every
// call goes through cudaApi(); nothing here includes a CUDA header (DESIGN §3 "Boundary").
#include "transport/nccl/device_stream.h"

#include <string>

#include "transport/nccl/loader.h"

namespace hvd::transport::nccl {

using common::Status;

DeviceStream::~DeviceStream() {
  if (cuda_ == nullptr) return;
  if (device_ >= 0) cuda_->setDevice(device_);
  if (stream_ != nullptr) cuda_->streamSynchronize(stream_);
  for (CudaEvent event : all_events_) cuda_->eventDestroy(event);
  if (producer_event_ != nullptr) cuda_->eventDestroy(producer_event_);
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
        "the CUDA runtime is not loaded (engine_native.gpu.require_nccl() loads it at the first "
        "CUDA tensor)");
  }
  device_ = device;
  HVD_RETURN_IF_ERROR(check(cuda_->setDevice(device), "cudaSetDevice"));
  HVD_RETURN_IF_ERROR(check(cuda_->streamCreateWithFlags(&stream_, kCudaStreamNonBlocking),
                            "cudaStreamCreateWithFlags"));
  return check(cuda_->eventCreateWithFlags(&producer_event_, kCudaEventDisableTiming),
               "cudaEventCreateWithFlags");
}

Status DeviceStream::pciBusId(std::string* out) const {
  char bus_id[64] = {0};
  HVD_RETURN_IF_ERROR(check(cuda_->deviceGetPciBusId(bus_id, sizeof(bus_id), device_),
                            "cudaDeviceGetPCIBusId"));
  *out = bus_id;
  return Status::ok();
}

Status DeviceStream::after(CudaStream producer) {
  if (producer == stream_) return Status::ok();
  HVD_RETURN_IF_ERROR(check(cuda_->eventRecord(producer_event_, producer), "cudaEventRecord"));
  // The wait captures the event's state now, so re-recording it for the next tensor is safe.
  return check(cuda_->streamWaitEvent(stream_, producer_event_, 0), "cudaStreamWaitEvent");
}

Status DeviceStream::deviceBuffer(size_t bytes, void** out) {
  if (bytes > device_bytes_) {
    HVD_RETURN_IF_ERROR(synchronize());  // queued copies may still read the old buffer
    if (device_buffer_ != nullptr) {
      HVD_RETURN_IF_ERROR(check(cuda_->free(device_buffer_), "cudaFree"));
      device_buffer_ = nullptr;
      device_bytes_ = 0;
    }
    HVD_RETURN_IF_ERROR(check(cuda_->malloc(&device_buffer_, bytes), "cudaMalloc"));
    device_bytes_ = bytes;
  }
  *out = device_buffer_;
  return Status::ok();
}

Status DeviceStream::hostBuffer(size_t bytes, void** out) {
  if (bytes > host_bytes_) {
    HVD_RETURN_IF_ERROR(synchronize());
    if (host_buffer_ != nullptr) {
      HVD_RETURN_IF_ERROR(check(cuda_->freeHost(host_buffer_), "cudaFreeHost"));
      host_buffer_ = nullptr;
      host_bytes_ = 0;
    }
    HVD_RETURN_IF_ERROR(check(cuda_->mallocHost(&host_buffer_, bytes), "cudaMallocHost"));
    host_bytes_ = bytes;
  }
  *out = host_buffer_;
  return Status::ok();
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

Status DeviceStream::makeWait(CudaStream consumer, CudaEvent event) const {
  return check(cuda_->streamWaitEvent(consumer, event, 0), "cudaStreamWaitEvent");
}

void DeviceStream::release(CudaEvent event) {
  if (event != nullptr) free_events_.push_back(event);
}

}  // namespace hvd::transport::nccl
