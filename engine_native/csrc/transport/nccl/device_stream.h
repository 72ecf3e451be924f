// DeviceStream: this rank's CUDA work queue for collectives on one device — a non-blocking
// stream, events that order it against the framework's streams, the device fusion buffer, and
// the pinned host buffer of the staged fallback (ranks sharing a GPU, or a reduction NCCL
// cannot run). Used by NcclCommunicator and by the staged path. Background thread only: the
// current CUDA device is per thread and init() sets it. Needs loadCudaRuntime() (loader.h).
//
// Note [Stream ordering]: a CUDA tensor arrives with the stream its producer ran on (the
// framework's current stream at enqueue). Before reading it, after(producer) records an event
// on that stream and makes this stream wait for it — on the device, so the host never blocks
// and a producer kernel still running at enqueue time is never overtaken. When the collective
// and the copies out are queued, record() marks the end; the background thread polls that
// event with query() and completes the handles once it fired, so wait() returns a tensor whose
// values are final.
//
// Note [Staged fallback]: after(producer); copy(fusion <- inputs); copy(host <- fusion);
// synchronize(); the CPU algorithm over shm/tcp on the host buffer (scaling included);
// copy(fusion <- host); copy(outputs <- fusion); record(). Every rank stages the same way, so
// ranks sharing one GPU never create an NCCL communicator (NCCL refuses duplicate GPUs).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/nccl/api.h"

namespace hvd::transport::nccl {

class DeviceStream {
 public:
  DeviceStream() = default;
  ~DeviceStream();  // drains the stream, then frees buffers, events and the stream
  DeviceStream(const DeviceStream&) = delete;
  DeviceStream& operator=(const DeviceStream&) = delete;

  // Selects `device` on this thread and creates the stream. kInternal when the CUDA runtime is
  // not loaded or the device cannot be used.
  common::Status init(int device);
  bool ready() const { return stream_ != nullptr; }
  int device() const { return device_; }
  CudaStream stream() const { return stream_; }
  // "0000:3b:00.0": with the host, names the physical GPU. Members of a process set exchange it
  // before creating an NCCL communicator; any repeat means ranks share a GPU -> staged fallback.
  common::Status pciBusId(std::string* out) const;

  // This stream waits (device side) for everything queued on `producer` so far. A null
  // producer is the legacy default stream, which cudaEventRecord accepts as well.
  common::Status after(CudaStream producer);

  // Buffers grown on demand and reused (contents undefined after growth). Growing the device
  // buffer first drains this stream, since queued work may still use the old one.
  common::Status deviceBuffer(size_t bytes, void** out);
  common::Status hostBuffer(size_t bytes, void** out);  // pinned (cudaMallocHost)

  // Asynchronous on this stream; the direction is inferred (unified virtual addressing).
  common::Status copy(void* dst, const void* src, size_t bytes);
  common::Status zero(void* dst, size_t bytes);
  // The host waits for everything queued on this stream.
  common::Status synchronize();

  // Completion events, pooled. record() marks everything queued so far; query() never blocks;
  // release() returns the event to the pool once nobody waits on it any more.
  common::Status record(CudaEvent* event);
  common::Status query(CudaEvent event, bool* finished) const;
  // `consumer` waits (device side) for `event`: lets a framework stream use the output without
  // blocking the host.
  common::Status makeWait(CudaStream consumer, CudaEvent event) const;
  void release(CudaEvent event);

  // A Status for a cudaError_t: "CUDA error in <call> on device N: <text> (code E)".
  common::Status check(int error, const char* call) const;

 private:
  const CudaApi* cuda_ = nullptr;
  int device_ = -1;
  CudaStream stream_ = nullptr;
  CudaEvent producer_event_ = nullptr;  // reused by after(): recorded, waited on, re-recorded
  void* device_buffer_ = nullptr;
  size_t device_bytes_ = 0;
  void* host_buffer_ = nullptr;
  size_t host_bytes_ = 0;
  std::vector<CudaEvent> free_events_;
  std::vector<CudaEvent> all_events_;
};

}  // namespace hvd::transport::nccl
