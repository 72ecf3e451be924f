// The CUDA-IPC halves of device point-to-point (Note [Device point-to-point] in
// runtime/device_peer_ops.cc). StagingRing: a sender's exported device memory and
// interprocess events for its messages to one peer. IpcImports: a receiver's opened segments
// and events of one peer. Both work on one device, whose DeviceStream they are given; the
// background thread only (with that device selected).
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/nccl/api.h"
#include "transport/nccl/device_stream.h"
#include "transport/peer_frame.h"

namespace hvd::transport::cuda {

class StagingRing {
 public:
  explicit StagingRing(nccl::DeviceStream& stream) : stream_(stream) {}
  // Keeps the segments and events: a peer may still map them (Note [IPC teardown]).
  ~StagingRing();
  StagingRing(const StagingRing&) = delete;
  StagingRing& operator=(const StagingRing&) = delete;

  // Room for `bytes` (> 0) and an event for message `message->sequence`: fills the message's
  // segment fields and handles, *dst (where to copy) and *event (what to record after). Never
  // waits for the receiver: with no room it exports a larger segment (Note [Device
  // point-to-point] C).
  common::Status reserve(uint64_t bytes, DeviceMessage* message, uint8_t** dst,
                         nccl::CudaEvent* event);
  // The receiver read message `sequence`: its room and event may be used again.
  void release(uint64_t sequence);
  // Where message `sequence`'s bytes are (its room, not released yet); false when unknown.
  bool find(uint64_t sequence, const uint8_t** data, uint64_t* bytes) const;
  uint64_t exportedBytes() const;  // every segment's, retired ones included

 private:
  struct Segment {
    uint64_t id = 0;
    uint8_t* memory = nullptr;
    uint64_t bytes = 0;
    uint64_t base_offset = 0;
    nccl::CudaIpcHandle handle{};
  };
  struct Held {  // a message's room, in reservation order
    uint64_t sequence;
    uint64_t segment;
    uint64_t begin, end;  // the room (aligned)
    uint64_t bytes;       // the message's
    size_t event;
    bool released = false;
  };
  struct Event {
    nccl::CudaEvent event = nullptr;
    nccl::CudaIpcHandle handle{};
    bool free = false;
  };

  bool place(uint64_t bytes, uint64_t* offset) const;  // in the current segment, or false
  common::Status grow(uint64_t bytes);
  common::Status takeEvent(size_t* index);

  nccl::DeviceStream& stream_;
  std::vector<Segment> segments_;  // back(): the current one; the others retired
  std::deque<Held> held_;
  std::vector<Event> events_;
};

class IpcImports {
 public:
  explicit IpcImports(nccl::DeviceStream& stream) : stream_(stream) {}
  ~IpcImports();  // close(), when nothing was left open by a stream that did not drain
  IpcImports(const IpcImports&) = delete;
  IpcImports& operator=(const IpcImports&) = delete;

  // Where `message`'s `bytes` are in this process, and its event; opens the segment and the
  // event at their first use and keeps them open. The peer's claims are checked against what
  // was mapped: a segment id always names the same handle, and the bytes lie inside the
  // mapped block (kInternal otherwise: the peer is not this job's code).
  common::Status open(const DeviceMessage& message, uint64_t bytes, const uint8_t** data,
                      nccl::CudaEvent* event);
  // Closes every mapping and event. Only once the stream that reads them drained.
  void close();

 private:
  nccl::DeviceStream& stream_;
  struct Mapped {
    std::string handle;   // its 64 bytes, as first named
    void* base = nullptr;  // what cudaIpcOpenMemHandle returned (closed by close())
    uint64_t bytes = 0;    // the mapped block's size (cuMemGetAddressRange)
  };
  std::map<uint64_t, Mapped> segments_;            // by the sender's segment id
  std::map<std::string, nccl::CudaEvent> events_;  // by handle bytes
};

}  // namespace hvd::transport::cuda
