// DeviceExecutor: the OpExecutor for CUDA tensors, the device mirror of CpuExecutor: per
// process set NCCL, CUDA IPC (ranks sharing one GPU) or the staged path (Note [Device path choice] in device_path.cc), work
// queued on this rank's device stream and completed later (Note [Deferred completion] in
// device_executor.cc). Created by the Executor at the first CUDA response (a CPU-only job
// never touches CUDA); background thread only (whoever holds the loop's progress lock).
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "runtime/metrics.h"
#include "runtime/op_executor.h"
#include "transport/cuda/ipc_peers.h"
#include "transport/nccl/communicator.h"
#include "transport/nccl/device_stream.h"

namespace hvd::runtime {

class HostWake;  // device_executor.cc: how the driver's callback reaches the loop

// A device op whose stream work is queued: its handles complete when `done` has fired.
struct DeviceCompletion {
  std::vector<int64_t> handles;
  OpResult result;
  std::vector<std::string> timeline_names;  // spans the Executor ends at completion
  common::Status status;                    // filled when it is handed back
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
  // copied to host memory (the first call queues the copies; the driver wakes the loop when
  // they landed). Ops that do not stage are ready at once.
  common::Status inputsReady(OpContext& op, bool* ready);
  // After an op method returned OK: marks the end of its stream work.
  common::Status queueCompletion(DeviceCompletion completion);
  // Moves the finished completions (in queue order) into `done`. Non-OK when the oldest one
  // made no progress for HVD_TIMEOUT or NCCL reported an asynchronous error: the loop fails
  // the core with it.
  common::Status poll(std::vector<DeviceCompletion>* done);
  bool busy() const { return !in_flight_.empty() || staging_.queued; }
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
  enum class Path { kNccl, kStaged, kIpc, kMixed };
  struct DeviceSet {
    Path path = Path::kStaged;
    int device = -1;
    std::unique_ptr<transport::nccl::NcclCommunicator> nccl;
    std::unique_ptr<transport::cuda::IpcPeers> ipc;
    uint64_t ipc_steps = 0;  // steps run so far: the same on every member (slot = steps % 2)
    bool ipc_last_drained = true;  // every member drained its stream in the last step
    std::unique_ptr<transport::Comm> gpu_comm;  // kMixed: the members on this rank's GPU
    bool leader = false;                        // kMixed: joins `nccl` for its GPU
  };
  // One window of an IPC step: bytes [lo, lo + n) of every member's input.
  using IpcWrite = std::function<common::Status(uint8_t* mine, size_t lo, size_t n)>;
  using IpcRead = std::function<common::Status(int slot, size_t lo, size_t n)>;
  struct InFlight {
    transport::nccl::CudaEvent done = nullptr;
    transport::nccl::DeviceStream* stream = nullptr;
    DeviceCompletion completion;
  };

  common::Status setUp(OpContext& op, int device);
  transport::nccl::DeviceStream& stream() { return *current_.stream; }
  int localDevice(const OpContext& op) const;  // -1: this rank has no device for it
  common::Status waitForInputs(const OpContext& op);
  bool ncclCannotReduce(const OpContext& op, double scale) const;
  transport::nccl::NcclCommunicator& nccl() { return *current_.set->nccl; }
  common::Status ncclAllreduce(OpContext& op);
  common::Status stagedAllreduce(OpContext& op);
  common::Status ncclAllgather(OpContext& op);
  common::Status stagedAllgather(OpContext& op);
  common::Status ncclBroadcast(OpContext& op);
  common::Status stagedBroadcast(OpContext& op);
  common::Status ncclAlltoall(OpContext& op);
  common::Status stagedAlltoall(OpContext& op);
  common::Status ncclReducescatter(OpContext& op);
  common::Status stagedReducescatter(OpContext& op);
  // device_ipc_ops.cc (Note [IPC step protocol] in transport/cuda/ipc_peers.cc)
  transport::cuda::IpcPeers& ipc() { return *current_.set->ipc; }
  common::Status ipcSteps(OpContext& op, size_t span, const IpcWrite& write,
                          const IpcRead& read);
  common::Status ipcReserve(OpContext& op, size_t span);
  common::Status ipcReduce(const OpContext& op, int slot, size_t src_offset, void* dst,
                           size_t bytes, double postscale);
  // The members IPC connects: the set, or on a mixed set the members on this rank's GPU.
  transport::Comm& ipcComm(OpContext& op) {
    return current_.set->gpu_comm ? *current_.set->gpu_comm : op.comm;
  }
  common::Status mixedAllreduce(OpContext& op);  // device_mixed_ops.cc
  common::Status ipcAllreduce(OpContext& op);
  common::Status ipcAllgather(OpContext& op);
  common::Status ipcBroadcast(OpContext& op);
  common::Status ipcAlltoall(OpContext& op);
  common::Status ipcReducescatter(OpContext& op);
  common::Status packWindow(const OpContext& op, uint8_t* dst, size_t lo, size_t n);
  common::Status ipcOutput(size_t bytes, OpResult* result, uint8_t** out);
  common::Status deviceOutput(size_t bytes, OpResult* result);
  bool stagesThroughHost(const OpContext& op) const;
  common::Status packInputs(const OpContext& op, uint8_t* base, bool zero_missing);
  common::Status unpackOutputs(const OpContext& op, const uint8_t* base);
  common::Status stageInputs(OpContext& op, bool* landed);
  // Phase A's bookkeeping, shared by the staged path and the host-ordered IPC path: *queued
  // when an earlier call queued this response's event (*landed: it fired); holdPhaseA keeps
  // `event` as that event and has the driver wake the loop once the stream passed it.
  common::Status phaseAQueued(const OpContext& op, bool* queued, bool* landed);
  common::Status holdPhaseA(const OpContext& op, transport::nccl::CudaEvent event,
                            uint8_t* host);
  // The host-ordered IPC path's phase A: the inputs' producers finished (device_ipc_ops.cc).
  common::Status awaitProducers(OpContext& op, bool* ready);
  void dropPhaseA();  // its op runs now: the event goes back to the stream
  // A bounded, abortable wait for this rank's stream (the host-ordered step, ipcReserve).
  common::Status waitForOwnStream(transport::Comm& comm, const char* what);
  common::Status takeStaged(uint8_t** in, uint8_t** out);
  common::Status stagedInput(OpContext& op, uint8_t** in, uint8_t** out);
  common::Status stageOutput(OpContext& op, void* device, const void* host, size_t bytes);
  common::Status notifyLoop();
  common::Status checkTimeout(std::chrono::steady_clock::time_point now);

  Metrics& metrics_;
  const common::Config& config_;
  std::shared_ptr<HostWake> wake_;
  std::map<int, std::unique_ptr<transport::nccl::DeviceStream>> streams_;  // per device
  std::map<int32_t, DeviceSet> sets_;
  struct Current {  // the response being executed
    DeviceSet* set = nullptr;
    transport::nccl::DeviceStream* stream = nullptr;
  } current_;
  std::deque<InFlight> in_flight_;  // queue order (= stream order: one stream per device)
  struct Staging {  // the staged op at the head of the loop's queue (device_staged_ops.cc, A)
    bool queued = false;
    coord::Key first;  // whose inputs these are (the response's first name, its set)
    int32_t process_set = -1;
    std::chrono::steady_clock::time_point since;
    transport::nccl::DeviceStream* stream = nullptr;
    transport::nccl::CudaEvent event = nullptr;  // after its copies to host memory
    uint8_t* host = nullptr;
    size_t out_offset = 0;  // where the CPU algorithm's result goes
  } staging_;
  std::chrono::steady_clock::time_point progress_at_;  // when the oldest in flight advanced
  int join_device_ = -1;
};

}  // namespace hvd::runtime
