// DeviceStream: this rank's CUDA work queue for collectives on one device — a non-blocking
// stream, events that order it against the framework's streams, the device fusion buffer, and
// the pinned host buffer of the staged fallback (ranks sharing a GPU, or a reduction NCCL
// cannot run). Used by NcclCommunicator and by the staged path. Background thread only: the
// current CUDA device is per thread and init() sets it. Needs loadCudaRuntime() (loader.h).
//
// Note [Stream ordering]: a CUDA tensor arrives with the stream its producer ran on (the
// framework's current stream at enqueue). At enqueue, on the framework thread, an event is
// recorded on that stream (runtime/ready_events.h); before reading the tensor, waitFor(event)
// makes this stream wait for it — on the device, so the host never blocks and a producer
// kernel still running at enqueue time is never overtaken, while work the framework queues
// after the enqueue is not waited for. When the collective and the copies out are queued,
// record() marks the end and notify() asks the driver to wake the background loop once it
// fired; the loop checks the event with query() and completes the handles, so wait() returns
// a tensor whose values are final.
//
// Note [Staged fallback]: waitFor(ready events); copy(host <- inputs); record() + notify();
// the loop goes on with other work until that event fired (no host thread waits on the
// device); then the CPU algorithm over shm/tcp on the pinned host buffer (scaling included);
// copy(outputs <- host); record(). Every member of a set stages the same way, so ranks sharing
// one GPU never create an NCCL communicator (NCCL refuses duplicate GPUs). The bodies are in
// runtime/device_staged_ops.cc.
#pragma once

#include <chrono>
#include <cstddef>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/nccl/api.h"

namespace hvd::transport::nccl {

// Gives the calling thread its current CUDA device back at the end of a scope: the loop's
// passes, which select the device they work on, may run on a framework thread (Note [Caller
// drives] in runtime/background_loop.cc), and that thread's device is the framework's business.
class DeviceRestorer {
 public:
  DeviceRestorer();  // no-op while the CUDA runtime is not loaded
  ~DeviceRestorer();
  DeviceRestorer(const DeviceRestorer&) = delete;
  DeviceRestorer& operator=(const DeviceRestorer&) = delete;

 private:
  int device_ = -1;
};

class DeviceStream {
 public:
  DeviceStream() = default;
  // Waits up to 2 s for queued work, then frees buffers, events and the stream; when the work
  // does not finish (a kernel it waits for hangs) they are left allocated, never freed under it.
  ~DeviceStream();
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;

  // Selects `device` on this thread and creates the stream. kInternal when the CUDA runtime is
  // not loaded or the device cannot be used.
  common::Status init(int device);
  bool ready() const { return stream_ != nullptr; }
  // Makes the device current on the calling thread (the loop's passes may run on a framework
  // thread that waits on its op: Note [Caller drives] in runtime/background_loop.cc).
  common::Status select() const;
  int device() const { return device_; }
  CudaStream stream() const { return stream_; }
  // "0000:3b:00.0": with the host, names the physical GPU. Members of a process set exchange it
  // before creating an NCCL communicator; any repeat means ranks share a GPU -> staged fallback.
  common::Status pciBusId(std::string* out) const;

  // This stream waits (device side) for `event`, as recorded when the call is made.
  common::Status waitFor(CudaEvent event);

  // Buffers grown on demand and reused (contents undefined after growth). A device buffer
  // replaced by a larger one is freed in this stream's order (Note [Ordered device memory]);
  // without that allocator, and for the host buffer, it is retired: freed by freeRetired()
  // once the caller knows this stream has drained (no completion pending).
  common::Status deviceBuffer(size_t bytes, void** out);
  common::Status hostBuffer(size_t bytes, void** out);  // pinned (cudaMallocHost)
  void freeRetired();

  // Asynchronous on this stream; the direction is inferred (unified virtual addressing).
  common::Status copy(void* dst, const void* src, size_t bytes);
  common::Status zero(void* dst, size_t bytes);
  // The host waits for everything queued on this stream.
  common::Status synchronize();
  // The same, bounded: false when `deadline` passed first (or the stream failed).
  bool drain(std::chrono::steady_clock::time_point deadline);
  // The same, for short waits on the hot path: polls for up to `spin`, yielding the core
  // between polls, then sleeps between polls (common/poll_pacer.h) until the deadline.
  // `stop` (may be empty) ends the wait early, e.g. when the job aborted.
  bool drain(std::chrono::steady_clock::time_point deadline, std::chrono::microseconds spin,
             const std::function<bool()>& stop);

  // Completion events, pooled. record() marks everything queued so far; query() never blocks;
  // release() returns the event to the pool once nobody waits on it any more.
  common::Status record(CudaEvent* event);
  common::Status query(CudaEvent event, bool* finished) const;
  // `fn(data)` runs on a driver thread once everything queued so far has run (it must not
  // call CUDA: it only wakes the background loop).
  common::Status notify(CudaHostFn fn, void* data);
  void release(CudaEvent event);

  // A Status for a cudaError_t: "CUDA error in <call> on device N: <text> (code E)".
  common::Status check(int error, const char* call) const;

 private:
  const CudaApi* cuda_ = nullptr;
  int device_ = -1;
  CudaStream stream_ = nullptr;
  void* device_buffer_ = nullptr;
  size_t device_bytes_ = 0;
  void* host_buffer_ = nullptr;
  size_t host_bytes_ = 0;
  std::vector<void*> retired_device_;  // replaced buffers queued work may still use
  std::vector<void*> retired_host_;
  std::vector<CudaEvent> free_events_;
  std::vector<CudaEvent> all_events_;
};

}  // namespace hvd::transport::nccl
