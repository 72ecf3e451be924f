// DeviceOutputPool: device memory for the outputs the core allocates for CUDA tensors
// (allgather, alltoall, reducescatter), reused instead of allocated and freed per op: cudaFree
// synchronises the whole device, from whatever thread drops the last tensor. A BlockPool per
// device (runtime/block_pool.h) over the stream-ordered allocator; Note [Output reuse] in
// device_output_pool.cc says when a block may be written again, and when it is freed.
// Process-wide (an output may outlive the init() that made it), never destroyed: blocks are
// taken by the background loop and given back by any thread that drops a tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/status.h"
#include "runtime/handle_table.h"
#include "transport/nccl/api.h"
#include "transport/nccl/device_stream.h"

namespace hvd::runtime {

class DeviceOutputPool {
 public:
  static DeviceOutputPool& instance();

  // A block of at least `bytes` on the stream's device (current on this thread); the stream
  // waits (on the device) for the block's last users before anything queued after this call.
  // Frees, in the stream's order, the blocks the cache evicted since the last call.
  // *capacity is the block's real size (a power of two), for give().
  common::Status take(size_t bytes, transport::nccl::DeviceStream& stream, void** block,
                      size_t* capacity);
  // The last tensor over `block` is gone; `consumer` (the dropping thread's current stream of
  // `device`, 0 for the legacy stream) is the stream its last use was queued on.
  void give(int device, void* block, size_t capacity, uintptr_t consumer);
};

// A block from take() as the output of an op or a message (`bytes` of it, on `device`): given
// back to the pool when the last tensor over it is gone (Note [Output reuse]).
std::shared_ptr<OutputBuffer> pooledDeviceOutput(void* block, size_t bytes, int device,
                                                 size_t capacity);

// An output that a stream which did not drain may still write: never given back nor reused,
// held until exit (Note [Device point-to-point] F, Note [NCCL point-to-point] F).
void keepUntilExit(std::shared_ptr<OutputBuffer> output);

}  // namespace hvd::runtime
