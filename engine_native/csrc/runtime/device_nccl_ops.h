// DeviceNcclOps: a process set's CUDA collectives through its NCCL communicator, one rank per
// GPU (Note [Device path choice], C, in device_path.cc). What NCCL cannot reduce stages (Note
// [Scaling without kernels] in communicator.h). Owns the communicator; owned by the
// DeviceExecutor's set. Background thread only; every call only queues work on the stream.
#pragma once

#include <memory>

#include "runtime/device_ops.h"
#include "runtime/metrics.h"
#include "transport/nccl/communicator.h"

namespace hvd::runtime {

class DeviceNcclOps : public DeviceOps {
 public:
  DeviceNcclOps(Metrics& metrics,
                std::unique_ptr<transport::nccl::NcclCommunicator> communicator);

  bool stagesThroughHost(const OpContext& op) const override;
  common::Status allreduce(OpContext& op, DeviceStream& stream) override;
  common::Status allgather(OpContext& op, DeviceStream& stream) override;
  common::Status broadcast(OpContext& op, DeviceStream& stream) override;
  common::Status alltoall(OpContext& op, DeviceStream& stream) override;
  common::Status reducescatter(OpContext& op, DeviceStream& stream) override;
  common::Status asyncError() override { return nccl_->asyncError(); }
  void abort() override { nccl_->abort(); }

 private:
  Metrics& metrics_;
  std::unique_ptr<transport::nccl::NcclCommunicator> nccl_;
};

}  // namespace hvd::runtime
