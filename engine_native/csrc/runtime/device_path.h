// Choosing how a process set's CUDA collectives travel: NCCL or the staged path. Called by the
// DeviceExecutor at the set's first CUDA response, i.e. at the same point of the response
// order on every member (the exchange below is itself a collective). Background thread only.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "transport/comm.h"
#include "transport/nccl/communicator.h"
#include "transport/nccl/device_stream.h"

namespace hvd::runtime {

struct PathChoice {
  bool nccl = false;
  std::string why;  // for the staged path: the reason, naming ranks (the one-time notice)
  std::unique_ptr<transport::nccl::NcclCommunicator> communicator;  // when nccl
};

// wanted: HVD_GPU_PATH on this rank ("auto", "nccl" or "staged"). Fails, identically on every
// member, only when some member demanded NCCL and it cannot be had.
common::Status choosePath(transport::Comm& comm, transport::nccl::DeviceStream& stream,
                          const std::string& wanted, PathChoice* out);

}  // namespace hvd::runtime
