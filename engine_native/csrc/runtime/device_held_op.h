// DeviceHeldOp: phase A's bookkeeping — the one device op held at the head of the loop's queue
// until what it waits for on the device has run: its inputs' copies to host memory (the staged
// path, device_staged_ops.cc) or its inputs' producers (the host-ordered IPC path,
// device_ipc_ops.cc). The loop goes on with other work meanwhile; the driver wakes it when the
// held event fired. Owned by the DeviceExecutor (one op at a time, whatever its set), shared
// with those two paths. Background thread only.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "coord/message.h"
#include "runtime/device_loop_wake.h"
#include "runtime/op_executor.h"
#include "transport/nccl/device_stream.h"

namespace hvd::runtime {

class DeviceHeldOp {
 public:
  explicit DeviceHeldOp(LoopWake& wake) : wake_(wake) {}

  bool held() const { return held_; }
  // *held when an earlier call held this response (*landed: its event fired). A hold left by
  // another response (dropped unrun) is released first.
  common::Status check(const OpContext& op, bool* held, bool* landed);
  // Holds `op` until `event` on `stream` fired, and has the driver wake the loop then. host:
  // the staged inputs (nullptr when nothing is staged); out_offset: where the result goes.
  common::Status hold(const OpContext& op, transport::nccl::DeviceStream& stream,
                      transport::nccl::CudaEvent event, uint8_t* host, size_t out_offset);
  // The staged path's phase B begins: the held host buffer (in) and the result's place in it
  // (out); the hold ends.
  common::Status take(uint8_t** in, uint8_t** out);
  void release();  // the held op runs now, or never: its event goes back to the stream
  // Held for longer than `timeout_seconds` (a producer that never finishes).
  bool overdue(std::chrono::steady_clock::time_point now, double timeout_seconds) const;

 private:
  LoopWake& wake_;
  bool held_ = false;
  coord::Key first_;  // whose op this is (the response's first name, its set)
  int32_t process_set_ = -1;
  std::chrono::steady_clock::time_point since_;
  transport::nccl::DeviceStream* stream_ = nullptr;
  transport::nccl::CudaEvent event_ = nullptr;
  uint8_t* host_ = nullptr;
  size_t out_offset_ = 0;
};

}  // namespace hvd::runtime
