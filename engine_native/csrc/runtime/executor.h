// Executor: runs one negotiated Response on this rank. It picks the OpExecutor by where the
// tensors live — CpuExecutor for host memory, DeviceExecutor (created at the first CUDA
// response) for CUDA tensors — records the timeline around it and completes the handles.
// Called only by the background thread, in response-list order (the order every rank shares).
// A transport failure (lost peer, timeout, abort) is returned so the loop can fail the core;
// an error Response (mismatch) completes its handles with that error and leaves the core usable.
// CPU ops complete when execute() returns; device ops when their stream work has run (Note
// [Deferred completion] in device_executor.cc): the loop calls pollDevice() every pass.
// Timeline, while a file is written: per name an <OP> span with dtype/shape, nested activities
// (MEMCPY_IN/OUT_FUSION_BUFFER for fused batches, <TRANSPORT>_<OP> around the algorithm),
// ended with the error text on failure; without a file, one span per response for the live
// strip (Note [Timeline detail] in executor.cc). A device op's spans end at its completion.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "coord/message.h"
#include "runtime/cpu_executor.h"
#include "runtime/device_executor.h"
#include "runtime/handle_table.h"
#include "runtime/metrics.h"
#include "runtime/op_executor.h"
#include "runtime/tensor_entry.h"
#include "timeline/timeline.h"
#include "transport/comm.h"

namespace hvd::runtime {

class Executor : private ActivityLog {
 public:
  // `timeline` may be null (no recording); it and `keys` (names for the timeline) outlive the
  // executor. wake_fd: the loop's eventfd (device ops' completions write it).
  Executor(HandleTable& handles, Metrics& metrics, const common::Config& config,
           timeline::Timeline* timeline, const coord::KeyTable& keys, int wake_fd);
  ~Executor() override;

  // Runs the response on its entries in `table` (absent entries belong to joined ranks and
  // contribute zeros), completes their handles (a device op: queues them) and removes them.
  // `transport` names how this rank reaches the set's peers ("SHM", "TCP"; a set spanning
  // both is "TCP"), for activity names.
  // `one_round`: the op's data came with its agreement (Note [One round] in one_round.cc).
  common::Status execute(const coord::Response& response, EntryTable& table,
                         transport::Comm& comm, const std::string& transport,
                         const OneRoundInputs* one_round = nullptr);

  // Before execute(): false while the response is a staged CUDA op whose inputs are still on
  // their way to host memory (the driver wakes the loop when they landed; call again then).
  // Everything else is ready at once. A non-OK result is for the loop to fail the core with.
  common::Status readyToExecute(const coord::Response& response, EntryTable& table,
                                transport::Comm& comm, bool* ready);

  // This rank submitted join(device=...): from now on its zeros for CUDA ops live there (the
  // peers' ops that need them run before the join itself completes).
  void noteJoinDevice(int device);
  // A process set was removed: its device state goes (false: device work still in flight,
  // try again later).
  bool dropProcessSet(int32_t id);

  // Completes the device ops whose stream work has run. A non-OK result (no progress for
  // HVD_TIMEOUT, an NCCL error) is for the loop to fail the core with.
  common::Status pollDevice();
  bool deviceBusy() const { return device_ && device_->busy(); }
  bool executing() const { return executing_; }  // inside execute(), its refiner included
  // Note [Caller waits on the device] in device_executor.cc: while a caller drives, the handle
  // it waits on (-1: none), whose completion then has no host function; callerPollsDevice():
  // that completion is still in flight.
  void setAwaitedHandle(int64_t handle) { awaited_handle_ = handle; }
  bool callerPollsDevice(int64_t handle) const { return device_ && device_->callerPolls(handle); }
  // Any thread, without the progress lock: some completion in flight is a caller's to poll
  // (false: a waiter need not take the lock to look).
  bool callerPollsAnyDevice() const { return caller_polled_.load(std::memory_order_acquire) > 0; }
  // The core failed: aborts the NCCL communicators and completes every device op in flight
  // with `status`.
  void failDevice(const common::Status& status);

  // Called with a failed op's Status before its handles complete; may return a better cause
  // (Note [Failure fan-out] in loop_pass.cc).
  void setFailureRefiner(std::function<common::Status(const common::Status&)> refine) {
    refine_ = std::move(refine);
  }

  // Note [Runtime allreduce choice]: hierarchical allreduce is the value currently in force,
  // which autotune may switch between responses (identically on every rank), so the allreduce
  // dispatcher reads hierarchicalAllreduce(), never config_.hierarchical_allreduce.
  void setHierarchicalAllreduce(bool on) { hierarchical_.store(on, std::memory_order_relaxed); }
  bool hierarchicalAllreduce() const { return hierarchical_.load(std::memory_order_relaxed); }
  // Per-tensor spans and activities while a timeline file is written (any thread).
  void setTimelineDetail(bool on) { detailed_.store(on, std::memory_order_relaxed); }

 private:
  common::Status run(OpContext& op, TensorEntry* first);
  OpExecutor& implementationFor(const coord::Response& r, TensorEntry* first);
  void lookUp(const coord::Response& r, EntryTable& table);
  void start(const char* activity) override;  // ActivityLog, for the implementations
  void end() override;
  bool recording() const { return timeline_ != nullptr && timeline_->enabled(); }
  void recordStart(const coord::Response& r, const std::vector<TensorEntry*>& entries);
  void complete(const common::Status& status, const OpResult& result);
  void recordEnd(const coord::Response& r, const std::string& error);
  std::vector<std::string> openSpans(const coord::Response& r) const;
  void finishDevice(std::vector<DeviceCompletion>& done);

  HandleTable& handles_;
  Metrics& metrics_;
  const common::Config& config_;
  timeline::Timeline* timeline_;
  const coord::KeyTable& keys_;
  const int wake_fd_;
  CpuExecutor cpu_;
  std::unique_ptr<DeviceExecutor> device_;  // at the first CUDA response
  int join_device_ = -1;                    // of this rank's last join(device=...)
  int64_t awaited_handle_ = -1;             // setAwaitedHandle
  std::atomic<int> caller_polled_{0};       // completions in flight with caller_polls
  std::atomic<bool> hierarchical_{false};
  std::atomic<bool> detailed_{false};  // Note [Timeline detail] in executor.cc
  bool detailed_now_ = false;          // for the response being executed
  const coord::Response* current_ = nullptr;  // for the activity calls
  bool executing_ = false;
  std::string summary_;                // its strip track when not detailed
  std::string transport_;              // of the response being executed
  std::vector<TensorEntry*> entries_;  // of the response being executed, per key
  std::vector<int64_t> done_handles_;  // its handles, completed together
  std::vector<OpResult> key_results_;  // a fused allgather's outputs, per key
  std::vector<DeviceCompletion> finished_;  // pollDevice's scratch
  std::function<common::Status(const common::Status&)> refine_;
};

}  // namespace hvd::runtime
