// DeviceIpcSteps: the CUDA IPC step engine of one process set's members on one GPU — their
// mapped staging slots (IpcPeers), the step count that picks the slot, and the slots' growth
// (Note [IPC slot size] in device_ipc_steps.cc). Each op runs as steps of Note [IPC step
// protocol] (transport/cuda/ipc_peers.cc): write my input window into my slot, one host
// barrier, then read the members' slots on the device. Owned by DeviceIpcOps (a set on one GPU)
// or DeviceMixedOps (the members on this rank's GPU). Background thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "common/config.h"
#include "common/status.h"
#include "runtime/op_executor.h"
#include "transport/comm.h"
#include "transport/cuda/ipc_peers.h"
#include "transport/nccl/device_stream.h"

namespace hvd::runtime {

class DeviceIpcSteps {
 public:
  // One window of a step: bytes [lo, lo + n) of every member's input.
  using Write = std::function<common::Status(uint8_t* mine, size_t lo, size_t n)>;
  using Read = std::function<common::Status(int slot, size_t lo, size_t n)>;

  DeviceIpcSteps(const common::Config& config, std::unique_ptr<transport::cuda::IpcPeers> peers);

  transport::cuda::IpcPeers& peers() { return *peers_; }
  bool hostOrdered() const { return peers_->hostOrdered(); }
  // The steps over the windows of `span` bytes among `comm`, the members IPC connects; the
  // same span on every member (computed from the response alone).
  common::Status run(transport::Comm& comm, transport::nccl::DeviceStream& stream, size_t span,
                     const Write& write, const Read& read);
  // dst[0 .. bytes) = the reduction of every member's slot bytes [src_offset, +bytes), with the
  // response's op and prescale, then `postscale` (Average: a sum, and the caller's postscale
  // divided by the size, as the CPU path does).
  common::Status reduce(const coord::Response& r, transport::nccl::DeviceStream& stream,
                        int slot, size_t src_offset, void* dst, size_t bytes, double postscale);

 private:
  common::Status reserve(transport::Comm& comm, transport::nccl::DeviceStream& stream,
                         size_t span);
  common::Status waitForOwnStream(transport::Comm& comm, transport::nccl::DeviceStream& stream,
                                  const char* what);

  const common::Config& config_;
  std::unique_ptr<transport::cuda::IpcPeers> peers_;
  uint64_t steps_ = 0;         // run so far: the same on every member (slot = steps % 2)
  bool last_drained_ = true;  // every member drained its stream in the last step
};

// The window [lo, lo + n) of the response's tensors packed in order (a joined rank's: zeros).
common::Status packWindow(const OpContext& op, transport::nccl::DeviceStream& stream,
                          uint8_t* dst, size_t lo, size_t n);

// [a, a + an) ∩ [b, b + bn) as (start, length); length 0 when they do not meet.
std::pair<size_t, size_t> overlap(size_t a, size_t an, size_t b, size_t bn);

}  // namespace hvd::runtime
