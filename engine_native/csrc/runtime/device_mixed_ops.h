// DeviceMixedOps: a mixed set's CUDA collectives (Note [Device path choice], E, in
// device_path.cc) — several GPUs, some shared by several members: its allreduce is
// hierarchical (device_mixed_ops.cc), everything else stages. Owns the members on this rank's
// GPU (their Comm and IPC steps) and, on a GPU's leader, the leaders' NCCL communicator. Owned
// by the DeviceExecutor's set. Background thread only; every call only queues work.
#pragma once

#include <memory>

#include "common/config.h"
#include "runtime/device_ipc_steps.h"
#include "runtime/device_ops.h"
#include "runtime/metrics.h"
#include "transport/comm.h"
#include "transport/nccl/communicator.h"

namespace hvd::runtime {

class DeviceMixedOps : public DeviceOps {
 public:
  // leaders: the NCCL communicator of one member per GPU, on this GPU's leader only.
  DeviceMixedOps(Metrics& metrics, const common::Config& config,
                 std::unique_ptr<transport::Comm> gpu_comm,
                 std::unique_ptr<transport::cuda::IpcPeers> peers,
                 std::unique_ptr<transport::nccl::NcclCommunicator> leaders);

  bool stagesThroughHost(const OpContext& op) const override;
  common::Status allreduce(OpContext& op, DeviceStream& stream) override;
  // The others stage (stagesThroughHost): reaching one is a dispatch bug.
  common::Status allgather(OpContext& op, DeviceStream&) override { return staged(op); }
  common::Status broadcast(OpContext& op, DeviceStream&) override { return staged(op); }
  common::Status alltoall(OpContext& op, DeviceStream&) override { return staged(op); }
  common::Status reducescatter(OpContext& op, DeviceStream&) override { return staged(op); }
  common::Status asyncError() override;
  void abort() override;

 private:
  common::Status staged(const OpContext& op) const;

  Metrics& metrics_;
  std::unique_ptr<transport::Comm> gpu_comm_;  // the members on this rank's GPU
  DeviceIpcSteps steps_;                       // among them
  std::unique_ptr<transport::nccl::NcclCommunicator> leaders_;  // nullptr: not the leader
};

}  // namespace hvd::runtime
