// DeviceIpcOps: a process set's CUDA collectives over CUDA IPC, for a set whose ranks all share
// one GPU (Note [Device path choice], D, in device_path.cc): each op runs as IPC steps
// (DeviceIpcSteps) — copies for allgather, broadcast and alltoall, the device reduction
// (transport/cuda/device_kernels.h) for allreduce and reducescatter; Adasum stages. Host-ordered
// (HVD_IPC_ORDER=host), an op is held until its inputs' producers finished (DeviceHeldOp).
// Owned by the DeviceExecutor's set. Background thread only; every call only queues work on the
// stream, and completion is deferred like the other paths.
#pragma once

#include <memory>

#include "common/config.h"
#include "runtime/device_held_op.h"
#include "runtime/device_ipc_steps.h"
#include "runtime/device_ops.h"
#include "runtime/metrics.h"

namespace hvd::runtime {

class DeviceIpcOps : public DeviceOps {
 public:
  DeviceIpcOps(Metrics& metrics, const common::Config& config, DeviceHeldOp& held,
               std::unique_ptr<transport::cuda::IpcPeers> peers);

  bool stagesThroughHost(const OpContext& op) const override;
  common::Status inputsReady(OpContext& op, DeviceStream& stream, bool* ready) override;
  common::Status allreduce(OpContext& op, DeviceStream& stream) override;
  common::Status allgather(OpContext& op, DeviceStream& stream) override;
  common::Status broadcast(OpContext& op, DeviceStream& stream) override;
  common::Status alltoall(OpContext& op, DeviceStream& stream) override;
  common::Status reducescatter(OpContext& op, DeviceStream& stream) override;

 private:
  common::Status steps(OpContext& op, DeviceStream& stream, size_t span,
                       const DeviceIpcSteps::Write& write, const DeviceIpcSteps::Read& read);

  Metrics& metrics_;
  DeviceHeldOp& held_;  // host-ordered: the op waiting for its producers
  DeviceIpcSteps steps_;
};

}  // namespace hvd::runtime
