// HostCopyStreams: per device, the one stream that holds only copies of final device bytes
// into host memory, for the CUDA point-to-point halves (IPC: Note [Device point-to-point] D
// in device_peer_ops.cc; NCCL: Note [NCCL point-to-point] E in device_nccl_peers.cc). A copy
// into pageable host memory returns only when it ran, so it waits for whatever its stream
// queued before it; on a stream of its own it waits for nothing but other such copies, never
// for another process's kernels. PeerOps owns it and gives it to both halves (it outlives
// them). Background thread only.
#pragma once

#include <chrono>
#include <map>
#include <memory>

#include "common/status.h"
#include "transport/nccl/device_stream.h"

namespace hvd::runtime {

class HostCopyStreams {
 public:
  // `device`'s stream, made at its first use, with `device` selected.
  common::Status get(int device, transport::nccl::DeviceStream** out);
  // Waits, until `deadline` at most, for every stream's copies (none waits on a peer).
  void drain(std::chrono::steady_clock::time_point deadline);

 private:
  std::map<int, std::unique_ptr<transport::nccl::DeviceStream>> streams_;  // by device
};

}  // namespace hvd::runtime
