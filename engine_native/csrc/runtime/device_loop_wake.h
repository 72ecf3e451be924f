// LoopWake: how queued device work wakes the background loop — notifyAfter(stream) has the
// driver write the loop's eventfd once the stream reaches that point (Note [Deferred
// completion] in device_executor.cc). Owned by the DeviceExecutor; used by it (completions) and
// by DeviceHeldOp (phase A). Background thread only; the write happens on a driver thread.
#pragma once

#include <memory>

#include "common/status.h"
#include "transport/nccl/device_stream.h"

namespace hvd::runtime {

class HostWake;  // device_loop_wake.cc: the duplicated fd the driver's callback writes

class LoopWake {
 public:
  explicit LoopWake(int wake_fd);  // the loop's eventfd
  common::Status notifyAfter(transport::nccl::DeviceStream& stream);

 private:
  std::shared_ptr<HostWake> wake_;
};

}  // namespace hvd::runtime
