// DeviceOps: how one process set's CUDA collectives run on this rank — one strategy per path of
// Note [Device path choice] (device_path.cc): DeviceNcclOps, DeviceIpcOps, DeviceMixedOps and
// DeviceStagedOps, which the others fall back to for what they cannot do. The DeviceExecutor
// owns them and picks one per response; each call gets the stream of the set's device (owned by
// the executor) and only queues work on it. Below: the pieces every path shares. Background
// thread only.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"
#include "runtime/op_executor.h"
#include "transport/nccl/device_stream.h"

namespace hvd::runtime {

class DeviceOps {
 public:
  using DeviceStream = transport::nccl::DeviceStream;
  virtual ~DeviceOps() = default;

  // This response runs on the staged path instead (what this path cannot do).
  virtual bool stagesThroughHost(const OpContext& op) const = 0;
  // Phase A, after prepare(): false while the op waits, unblocking, for its inputs (the loop
  // is woken when they are ready). Paths without a phase A are ready at once.
  virtual common::Status inputsReady(OpContext& op, DeviceStream& stream, bool* ready);
  virtual common::Status allreduce(OpContext& op, DeviceStream& stream) = 0;
  virtual common::Status allgather(OpContext& op, DeviceStream& stream) = 0;
  virtual common::Status broadcast(OpContext& op, DeviceStream& stream) = 0;
  virtual common::Status alltoall(OpContext& op, DeviceStream& stream) = 0;
  virtual common::Status reducescatter(OpContext& op, DeviceStream& stream) = 0;
  // NCCL's asynchronous error, for a path with a communicator (a collective that never ends).
  virtual common::Status asyncError() { return common::Status::ok(); }
  // Failure or abort: a collective waiting on a lost peer returns.
  virtual void abort() {}
};

// Note [Result target]: an allreduce or a broadcast writes a lone tensor's result straight into
// its output; a fused batch's, or a joined rank's (it has no tensor), into the stream's device
// fusion buffer, which unpackOutputs() copies out (a joined rank's result is scratch).
struct ResultTarget {
  uint8_t* data = nullptr;
  bool lone = false;  // data is the response's one tensor's output
};
common::Status resultTarget(const OpContext& op, transport::nccl::DeviceStream& stream,
                            size_t bytes, ResultTarget* target);

// An output the core allocates (allgather, alltoall, reducescatter): `bytes` of the device
// output pool, given back when the last tensor over it is dropped.
common::Status deviceOutput(transport::nccl::DeviceStream& stream, size_t bytes,
                            OpResult* result);

// A batch's tensors to their offsets of a packed buffer (device or pinned host memory), in
// response order; a joined rank's slots are zeroed on the stream when `zero_missing`.
common::Status packInputs(const OpContext& op, transport::nccl::DeviceStream& stream,
                          uint8_t* base, bool zero_missing);
// The reverse: every tensor of the batch this rank has gets its slot of the packed result.
common::Status unpackOutputs(const OpContext& op, transport::nccl::DeviceStream& stream,
                             const uint8_t* base);

}  // namespace hvd::runtime
