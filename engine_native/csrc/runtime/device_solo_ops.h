// DeviceSoloOps: the CUDA collectives of a process set with one member (np=1, or a set of one
// rank): nothing to exchange, so no NCCL, IPC or staging — each op is a device copy (or
// nothing, in place) and, where a scale factor applies, the device reduce kernel over one
// source (Note [A world of one] in device_solo_ops.cc). Owned by the DeviceExecutor's set;
// background thread only; every call only queues work on the stream.
#pragma once

#include <optional>

#include "runtime/device_ops.h"
#include "runtime/metrics.h"

namespace hvd::runtime {

class DeviceSoloOps : public DeviceOps {
 public:
  explicit DeviceSoloOps(Metrics& metrics) : metrics_(metrics) {}

  bool stagesThroughHost(const OpContext& op) const override;
  common::Status allreduce(OpContext& op, DeviceStream& stream) override;
  common::Status allgather(OpContext& op, DeviceStream& stream) override;
  common::Status broadcast(OpContext& op, DeviceStream& stream) override;
  common::Status alltoall(OpContext& op, DeviceStream& stream) override;
  common::Status reducescatter(OpContext& op, DeviceStream& stream) override;

 private:
  bool kernelsReady() const;  // the device reduce kernel compiled (asked once, at first need)
  // dst = input scaled as the response says (a copy when the factors are 1).
  common::Status reduceOne(const OpContext& op, DeviceStream& stream, const void* input,
                           void* output, size_t count) const;

  Metrics& metrics_;
  mutable std::optional<bool> kernels_ready_;
};

}  // namespace hvd::runtime
