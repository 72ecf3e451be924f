// IpcPeers: the CUDA-IPC state of one process set whose members share one GPU — this rank's
// exported staging buffer (two slots) and interprocess events, and every peer's buffer and
// events opened in this process. Owned by the set's IPC steps (runtime/device_ipc_steps.h);
// runtime/device_path.cc exchanges the IpcExport records over the set's CPU Comm; background
// thread only.
// Note [IPC step protocol] (ipc_peers.cc) says which events order which buffer accesses.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/nccl/api.h"
#include "transport/nccl/device_stream.h"

namespace hvd::transport::cuda {

constexpr int kIpcSlots = 2;  // steps alternate between them (Note [IPC step protocol])

// One member's export, the same size on every rank (it travels in a CPU allgather).
struct IpcExport {
  nccl::CudaIpcHandle memory;                     // the buffer: kIpcSlots * slot_bytes
  nccl::CudaIpcHandle input_ready[kIpcSlots];     // "my slot holds this step's input"
  nccl::CudaIpcHandle reads_done[kIpcSlots];      // "I finished reading the peers' slot"
  uint64_t slot_bytes;
  uint64_t offset;  // the buffer's offset in the block the handle maps (Note [IPC sub-allocation])
  int32_t host_ordered;  // HVD_IPC_ORDER=host on this member (Note [IPC step protocol])
  int32_t ok;
  char error[192];
};

class IpcPeers {
 public:
  // host_ordered: what this rank asks for (HVD_IPC_ORDER=host); the set uses host ordering
  // when any member asks for it, so that every member runs the same protocol.
  IpcPeers(nccl::DeviceStream& stream, bool host_ordered)
      : stream_(stream), host_ordered_(host_ordered) {}
  ~IpcPeers();  // closeImported(); keeps this rank's exports (Note [IPC teardown])
  IpcPeers(const IpcPeers&) = delete;
  IpcPeers& operator=(const IpcPeers&) = delete;

  // Allocates this rank's buffer and events and fills `out` (ok = 0 and the error on failure:
  // the caller shares the outcome so that every member falls back together).
  void exportOwn(size_t slot_bytes, IpcExport* out);
  // Opens every other member's buffer and events; `me` is this rank's index in `all`.
  common::Status openPeers(const std::vector<IpcExport>& all, int me);
  // Closes the peers' mappings and events (Note [IPC teardown]) — only once this rank's
  // stream drained (queued copies may still read a mapping); when it does not drain in time (a
  // dead peer's event never fires) they stay, and a warning says so.
  void closeImported();
  // Frees this rank's exported buffer and events. Only after every peer's closeImported()
  // returned (a barrier between): CUDA leaves freeing a region a peer still maps undefined.
  void freeOwn();

  size_t slotBytes() const { return slot_bytes_; }
  // The set's protocol, agreed in openPeers(): Note [IPC step protocol], host-ordered variant.
  bool hostOrdered() const { return host_ordered_; }
  int members() const { return static_cast<int>(buffers_.size()); }
  // Member m's slot (this rank's own, or a peer's mapping), as this process addresses it.
  uint8_t* slot(int member, int slot) const {
    return static_cast<uint8_t*>(buffers_[member]) + slot * slot_bytes_;
  }

  // Note [IPC step protocol], (a)-(d): each queues on this rank's stream.
  common::Status waitPeersReadsDone(int slot);   // (a) before overwriting my slot
  common::Status recordInputReady(int slot);      // (b) after writing it
  common::Status waitPeersInputReady(int slot);   // (c) after the host barrier
  common::Status recordReadsDone(int slot);       // (d) after the reads of this step

 private:
  common::Status waitAll(const std::vector<nccl::CudaEvent>* events, int slot);
  const nccl::CudaApi* api() const;

  nccl::DeviceStream& stream_;
  bool host_ordered_;
  size_t slot_bytes_ = 0;
  int me_ = -1;
  void* own_ = nullptr;                              // cudaMalloc'd, exported
  nccl::CudaEvent own_input_[kIpcSlots] = {};
  nccl::CudaEvent own_reads_[kIpcSlots] = {};
  std::vector<void*> buffers_;                       // per member; [me_] == own_
  std::vector<void*> mapped_;                        // per member: the opened block's base
  std::vector<nccl::CudaEvent> input_[kIpcSlots];    // per member (peers: opened; me: own)
  std::vector<nccl::CudaEvent> reads_[kIpcSlots];
};

}  // namespace hvd::transport::cuda
