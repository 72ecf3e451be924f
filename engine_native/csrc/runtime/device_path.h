// Choosing how a process set's CUDA collectives travel: NCCL, CUDA IPC or the staged path. Called by the
// DeviceExecutor at the set's first CUDA response, i.e. at the same point of the response
// order on every member (the exchange below is itself a collective). Background thread only.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "transport/comm.h"
#include "transport/cuda/ipc_peers.h"
#include "transport/nccl/communicator.h"
#include "transport/nccl/device_stream.h"

namespace hvd::runtime {

struct PathChoice {
  bool nccl = false;
  bool ipc = false;
  bool mixed = false;  // IPC among the ranks of each GPU, NCCL among one leader per GPU
  bool leader = false;                                     // mixed: this rank joins NCCL
  std::unique_ptr<transport::Comm> gpu_comm;               // mixed: the ranks on my GPU
  std::string why;  // for the staged path: the reason, naming ranks (the one-time notice)
  std::unique_ptr<transport::nccl::NcclCommunicator> communicator;  // nccl; mixed: leaders
  std::unique_ptr<transport::cuda::IpcPeers> peers;                 // ipc; mixed: my GPU's
};

// What this rank asks for: HVD_GPU_PATH ("auto", "nccl", "ipc" or "staged"), HVD_IPC_ORDER=host,
// and NCCL_MULTI_RANK_GPU_ENABLE (Note [Device path choice] F), all from its Config.
struct PathWish {
  std::string wanted = "auto";
  bool ipc_host_ordered = true;
  bool nccl_multi_rank_gpu = false;
};

// Fails, identically on every member, only when some member demanded NCCL or IPC and it
// cannot be had.
common::Status choosePath(transport::Comm& comm, transport::nccl::DeviceStream& stream,
                          const PathWish& wish, PathChoice* out);

// Every member exports a buffer of kIpcSlots * slot_bytes and opens the others' (an allgather
// of IpcExport records, then one of the outcomes: Note [Device path choice], D). On success
// *peers is connected; when any member failed, every member drops its state and *why names
// each failure (the caller stages, or fails when growing). Core failures (the CPU Comm) only
// in the Status.
common::Status connectIpc(transport::Comm& comm, transport::nccl::DeviceStream& stream,
                          size_t slot_bytes, bool host_ordered,
                          std::unique_ptr<transport::cuda::IpcPeers>* peers, std::string* why);

}  // namespace hvd::runtime
