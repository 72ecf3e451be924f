// ReadyEvent: the CUDA event a framework thread records on a tensor's producer stream when it
// enqueues the op (Note [Stream ordering] in transport/nccl/device_stream.h); the device
// executor makes its stream wait on it, then the event returns to a per-device pool. Owned by
// the TensorEntry (move-only): an entry dropped without executing (abort, mismatch, a cleared
// table) returns its event too. record() runs on framework threads, release on the background
// thread: the pool is locked. It lives for the whole process (events outlive one init()).
#pragma once

#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "transport/nccl/api.h"

namespace hvd::runtime {

class ReadyEvent {
 public:
  ReadyEvent() = default;
  ~ReadyEvent() { reset(); }
  ReadyEvent(ReadyEvent&& other) noexcept : event_(other.event_), device_(other.device_) {
    other.event_ = nullptr;
  }
  ReadyEvent& operator=(ReadyEvent&& other) noexcept;
  ReadyEvent(const ReadyEvent&) = delete;
  ReadyEvent& operator=(const ReadyEvent&) = delete;

  // Records a pooled event of `device` on `producer` (0: the legacy default stream). Needs the
  // CUDA runtime loaded; a failure names the CUDA call.
  common::Status record(int device, transport::nccl::CudaStream producer);
  transport::nccl::CudaEvent get() const { return event_; }
  void reset();  // back to the pool

 private:
  transport::nccl::CudaEvent event_ = nullptr;
  int device_ = -1;
};

// Note [Graph capture] (runtime/enqueue_checks.cc): an InvalidArgument naming `what` when the
// producer's `stream` (0: the legacy stream) is capturing a CUDA graph; OK otherwise, and when
// the CUDA runtime is not loaded (recording the ready event then says how to load it).
common::Status refuseGraphCapture(uintptr_t stream, std::string_view what);

}  // namespace hvd::runtime
