// DeviceStagedOps: CUDA collectives staged through pinned host memory (Note [Staged fallback] in
// transport/nccl/device_stream.h) — a set's every op where neither NCCL nor CUDA IPC serves it,
// and what the other paths cannot do. Two phases, so that the loop never blocks on the device
// (device_staged_ops.cc). No state of its own: the op held in phase A is the executor's
// DeviceHeldOp. Owned by the DeviceExecutor, one for all sets. Background thread only.
#pragma once

#include <cstdint>

#include "common/config.h"
#include "runtime/device_held_op.h"
#include "runtime/device_ops.h"
#include "runtime/metrics.h"

namespace hvd::runtime {

class DeviceStagedOps : public DeviceOps {
 public:
  DeviceStagedOps(Metrics& metrics, const common::Config& config, DeviceHeldOp& held)
      : metrics_(metrics), config_(config), held_(held) {}

  bool stagesThroughHost(const OpContext&) const override { return true; }
  common::Status inputsReady(OpContext& op, DeviceStream& stream, bool* ready) override;
  common::Status allreduce(OpContext& op, DeviceStream& stream) override;
  common::Status allgather(OpContext& op, DeviceStream& stream) override;
  common::Status broadcast(OpContext& op, DeviceStream& stream) override;
  common::Status alltoall(OpContext& op, DeviceStream& stream) override;
  common::Status reducescatter(OpContext& op, DeviceStream& stream) override;

 private:
  common::Status stagedInput(OpContext& op, uint8_t** in, uint8_t** out);
  common::Status stageOutput(OpContext& op, DeviceStream& stream, void* device, const void* host,
                             size_t bytes);

  Metrics& metrics_;
  const common::Config& config_;
  DeviceHeldOp& held_;  // phase A: the op whose inputs are being copied to host memory
};

}  // namespace hvd::runtime
