// What a framework thread asks of point-to-point (runtime/peer_ops.h): one send, one receive.
#pragma once

#include <cstdint>
#include <vector>

#include "common/dtype.h"

namespace hvd::runtime {

// A send: `data` (bytes of dtype x shape) must stay valid until its handle completes. A CUDA
// tensor (device >= 0) is read after what its producer's `stream` (cudaStream_t; 0: the legacy
// stream) had queued at submission.
struct PeerSend {
  int peer = -1;
  int64_t tag = 0;
  common::DataType dtype = common::DataType::kUint8;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  int device = -1;
  uintptr_t stream = 0;
};
// A receive: `device` (-1: none) is the CUDA device that reads a CUDA tensor sent from this
// host; its result stays there when `on_device`, else it lands in host memory.
// `into` (host memory, null: none) may take a host message of exactly `into_dtype` x
// `into_shape`, written there with no copy in between; it must stay valid until the handle
// completes (Note [Receive into out] in peer_ops_into.cc). `expects` (set with `into`, or
// alone for an out= the core cannot write): the caller fills an out= of into_dtype x
// into_shape, so a message of another type is refused (Note [Refused messages]).
struct PeerRecv {
  int peer = -1;
  int64_t tag = 0;
  int device = -1;
  bool on_device = false;
  // A result on `device` of a message that came by CUDA IPC (or NCCL): the cudaStream_t (0:
  // the legacy default) that waits for its copy (ncclRecv), the receive completing once that
  // is queued (Note [Device point-to-point] I says where NCCL's cannot be); -1: once it ran.
  // Only for a caller that waits at once.
  int64_t consumer = -1;
  uint8_t* into = nullptr;
  bool expects = false;
  common::DataType into_dtype = common::DataType::kUint8;
  std::vector<int64_t> into_shape;
};

}  // namespace hvd::runtime
