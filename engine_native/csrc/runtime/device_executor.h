// DeviceExecutor: the OpExecutor for CUDA tensors, the device mirror of CpuExecutor. Per
// process set it chooses a path with the other members (Note [Device path choice] in
// device_path.cc) and keeps that path's strategy (device_ops.h: NCCL, CUDA IPC, mixed, or the
// staged path, which also takes what the others cannot do); per response it selects the
// device's stream and hands the op to the strategy; the work it queued completes later (Note
// [Deferred completion] in device_executor.cc). Created by the Executor at the first CUDA
// response (a CPU-only job never touches CUDA); background thread only (whoever holds the
// loop's progress lock).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "runtime/device_held_op.h"
#include "runtime/device_loop_wake.h"
#include "runtime/device_ops.h"
#include "runtime/device_staged_ops.h"
#include "runtime/metrics.h"
#include "runtime/op_executor.h"
#include "transport/nccl/device_stream.h"

namespace hvd::runtime {

// A device op whose stream work is queued: its handles complete when `done` has fired.
struct DeviceCompletion {
  std::vector<int64_t> handles;
  OpResult result;
  std::vector<std::string> timeline_names;  // spans the Executor ends at completion
  common::Status status;                    // filled when it is handed back
  // Its waiting caller polls the event: no host function wakes the loop (Note [Caller waits
  // on the device] in device_executor.cc).
  bool caller_polls = false;
};

class DeviceExecutor : public OpExecutor {
 public:
  // wake_fd: the loop's eventfd; written (from a driver thread) when queued work finished.
  DeviceExecutor(Metrics& metrics, const common::Config& config, int wake_fd);
  ~DeviceExecutor() override;  // aborts communicators with work in flight, frees the rest

  common::Status allreduce(OpContext& op) override;
  common::Status allgather(OpContext& op) override;
  common::Status broadcast(OpContext& op) override;
  common::Status alltoall(OpContext& op) override;
  common::Status reducescatter(OpContext& op) override;

  // Before an op method: selects the response's device and, at a set's first CUDA response,
  // chooses its path with the other members; queues the stream's waits for the inputs'
  // producers. Idempotent for one response. A failure here is a core failure (the members
  // are out of step).
  common::Status prepare(OpContext& op);
  // After prepare(), before the op method: false while a staged op's inputs are still being
  // copied to host memory, or a host-ordered IPC op's producers still run (the first call
  // queues that; the driver wakes the loop when it is done). Other ops are ready at once.
  common::Status inputsReady(OpContext& op, bool* ready);
  // After an op method returned OK: marks the end of its stream work.
  common::Status queueCompletion(DeviceCompletion completion);
  // `handle` is in a completion in flight that its caller polls (no host function).
  bool callerPolls(int64_t handle) const;
  // Moves the finished completions (in queue order; on each stream, those before its first
  // unfinished one) into `done`. Non-OK when the oldest one made no progress for HVD_TIMEOUT
  // or NCCL reported an asynchronous error: the loop fails the core with it.
  common::Status poll(std::vector<DeviceCompletion>* done);
  bool busy() const { return !in_flight_.empty() || held_.held(); }
  // Failure, abort or shutdown: aborts every NCCL communicator when the core failed or ops
  // are in flight (a collective waiting on a lost peer returns), waits a bounded time for the
  // streams, and hands back every op in flight.
  void abort(std::vector<DeviceCompletion>* all, bool core_failed);
  // join(device=...): where this rank's zeros live when it has no tensor of its own.
  void noteJoinDevice(int device) { join_device_ = device; }
  // A process set was removed: its communicator goes (false while its work is in flight:
  // call again later).
  bool dropProcessSet(int32_t id);

 private:
  struct DeviceSet {
    int device = -1;
    std::unique_ptr<DeviceOps> ops;  // nullptr: the set stages every op (staged_)
  };
  struct InFlight {
    transport::nccl::CudaEvent done = nullptr;
    transport::nccl::DeviceStream* stream = nullptr;
    DeviceCompletion completion;
  };

  common::Status setUp(OpContext& op, int device);
  int localDevice(const OpContext& op) const;  // -1: this rank has no device for it
  common::Status waitForInputs(const OpContext& op);
  DeviceOps& opsFor(const OpContext& op);  // the current set's path, or the staged one
  transport::nccl::DeviceStream& stream() { return *current_.stream; }
  common::Status checkTimeout(std::chrono::steady_clock::time_point now);

  Metrics& metrics_;
  const common::Config& config_;
  LoopWake wake_;
  DeviceHeldOp held_;       // phase A of the staged and the host-ordered IPC path
  DeviceStagedOps staged_;  // every set's fallback
  std::map<int, std::unique_ptr<transport::nccl::DeviceStream>> streams_;  // per device
  std::map<int32_t, DeviceSet> sets_;
  struct Current {  // the response being executed
    DeviceSet* set = nullptr;
    transport::nccl::DeviceStream* stream = nullptr;
  } current_;
  std::deque<InFlight> in_flight_;  // queue order (each device's: its one stream's order)
  std::vector<transport::nccl::DeviceStream*> pending_streams_;  // poll()'s scratch
  std::chrono::steady_clock::time_point progress_at_;  // when the oldest in flight advanced
  int join_device_ = -1;
};

}  // namespace hvd::runtime
