// DevicePeerOps: the CUDA half of point-to-point between ranks of one host (issue #36). A
// send copies the tensor into device memory of its own that it exported to the receiver
// (transport/cuda/ipc_messages.h) and the message says where; the receiver copies it out on
// its stream once the sender's event fired, then tells the sender, which reuses the memory.
// Note [Device point-to-point] in device_peer_ops.cc has the rules. Owned by PeerOps, which
// moves the frames; background thread only (whoever holds the loop's progress lock).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "runtime/device_loop_wake.h"
#include "runtime/handle_table.h"
#include "runtime/host_copy_streams.h"
#include "transport/cuda/ipc_messages.h"
#include "transport/nccl/device_stream.h"
#include "transport/peer_frame.h"

namespace hvd::runtime {

class DevicePeerOps {
 public:
  // wake_fd: the loop's eventfd, written by the driver when queued copies finished;
  // host_copies: the per-device streams of host results' copies (shared, outlives this).
  DevicePeerOps(int wake_fd, double timeout_seconds, HostCopyStreams& host_copies);
  ~DevicePeerOps();  // waits (bounded) for the streams, closes imports; keeps exports
  DevicePeerOps(const DevicePeerOps&) = delete;
  DevicePeerOps& operator=(const DevicePeerOps&) = delete;

  // Sender: on `device`'s stream, waits for `ready` (the producer), copies `bytes` (> 0) from
  // `data` into the memory staged for `peer`, records the message's event; fills *message.
  // poll() reports `id` once the copy finished (the tensor is free again). `what` names the
  // op in errors.
  common::Status stage(int peer, int device, transport::nccl::CudaEvent ready, const void* data,
                       uint64_t bytes, uint64_t id, const std::string& what,
                       transport::DeviceMessage* message);
  // The receiver read `peer`'s message `sequence` (its kDeviceRead frame came).
  void released(int peer, uint64_t sequence);
  // The receiver could not read message `sequence` (kDeviceRefused): copies its bytes, once
  // its staging copy finished, into host memory; poll() reports `id` with them. The room
  // stays until released().
  common::Status restage(int peer, uint64_t sequence, uint64_t id);

  // Receiver: copies `message` (`bytes` > 0) from `peer` into a new output, on `device` when
  // `on_device`, else in host memory (the copy runs on `device`'s stream either way).
  // poll() reports `id` with the output. With a `consumer` stream (>= 0) and `on_device`
  // (Note [Device point-to-point] I): that stream waits for the copy, *handed_over is the
  // output at once, and poll() reports the finished copy only as a receipt to send; where
  // the stream cannot wait, *handed_over stays empty and *handover says why (the copy is
  // queued either way).
  common::Status read(int peer, const transport::DeviceMessage& message, uint64_t bytes,
                      int device, bool on_device, uint64_t id, const std::string& what,
                      int64_t consumer, std::shared_ptr<OutputBuffer>* handed_over,
                      common::Status* handover);

  struct Done {
    uint64_t id = 0;
    std::shared_ptr<OutputBuffer> output;  // a read's; none for a read handed over (I)
    int receipt_peer = -1;                 // I: a handed-over read's receipt goes to it
    uint64_t receipt_sequence = 0;
  };
  // Appends the finished copies, in queue order per stream. Non-OK when one made no progress
  // for HVD_TIMEOUT: the rank fails with it (its stream waits on something that never comes).
  common::Status poll(std::vector<Done>* done);
  bool busy() const { return !copies_.empty(); }
  // Note [Device point-to-point] H: the handle a driving caller waits on (-1: none); a copy
  // queued for it then asks for no wake, and callerPolls(it) holds until poll() reports it.
  // callerPollsAny() may be read without the lock.
  void setAwaitedHandle(int64_t handle) { awaited_ = handle; }
  bool callerPolls(int64_t handle) const;
  bool callerPollsAny() const { return caller_polled_.load(std::memory_order_acquire) > 0; }
  // The rank failed: forgets the copies in flight, after waiting a bounded time for them.
  void abandon();

 private:
  struct PerDevice {
    std::unique_ptr<transport::nccl::DeviceStream> stream;
    std::map<int, std::unique_ptr<transport::cuda::StagingRing>> rings;   // by peer
    std::map<int, std::unique_ptr<transport::cuda::IpcImports>> imports;  // by peer
  };
  static constexpr uint64_t kHandedOver = ~uint64_t{0};  // I: no handle waits for the copy
  struct Copy {
    uint64_t id = 0;
    std::string what;
    transport::nccl::DeviceStream* stream = nullptr;
    transport::nccl::CudaEvent done = nullptr;  // the stream's pooled event
    // A host read's first phase: the sender's bytes are final; the copy out comes next, on
    // `copy_out` (the device's HostCopyStreams stream).
    bool gated = false;
    transport::nccl::DeviceStream* copy_out = nullptr;
    const uint8_t* source = nullptr;
    std::shared_ptr<OutputBuffer> output;
    std::chrono::steady_clock::time_point since;
    bool caller_polls = false;  // H: no host function was queued for it
    int receipt_peer = -1;      // I: handed over; its completion only sends this receipt
    uint64_t receipt_sequence = 0;
  };

  common::Status device(int ordinal, PerDevice** out);
  // Records copy.done and asks for a wake, unless the copy's own caller polls it (H).
  common::Status queueDone(Copy copy);
  void forget(Copy& copy);  // a copy leaves copies_
  common::Status copyOut(Copy& copy);   // a gated host read's second phase
  // Phase 1 of a copy of `bytes` at `source` into host memory, on `d`'s streams.
  common::Status startHostCopy(PerDevice& d, int device_ordinal, const uint8_t* source,
                               uint64_t bytes, uint64_t id, const std::string& what);
  bool drain();  // false when a stream did not finish in time

  LoopWake wake_;
  const std::chrono::duration<double> timeout_;
  HostCopyStreams& host_copies_;
  std::map<int, PerDevice> devices_;
  std::map<int, uint64_t> next_sequence_;  // by peer
  std::deque<Copy> copies_;  // in queue order
  std::vector<const transport::nccl::DeviceStream*> moved_;  // poll()'s
  int64_t awaited_ = -1;     // setAwaitedHandle
  std::atomic<int> caller_polled_{0};  // copies in flight with caller_polls
};

}  // namespace hvd::runtime
