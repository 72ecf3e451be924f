#include "transport/nccl/ordered_memory.h"

#include <atomic>

#include "common/logging.h"

namespace hvd::transport::nccl {

// Note [Ordered device memory]: the core's device buffers (outputs it allocates, its fusion
// buffer) come from CUDA's stream-ordered allocator: cudaMallocAsync on the stream that first
// uses the memory, cudaFreeAsync on a stream ordered after its last use, so neither the host
// nor other streams wait (cudaFree waits for the whole device: it cost one synchronisation
// per op while outputs were freed in their tensor's deleter). The allocator exists from CUDA
// 11.2 and only on devices with memory pools; without it (the symbols are missing, or the
// first cudaMallocAsync answers cudaErrorNotSupported) the process falls back, for good and
// logged once, to cudaMalloc/cudaFree: then a free waits for the device, which the core keeps
// off the steady state (outputs reuse cached blocks, the fusion buffer only grows) but not off
// a buffer's growth or a cached block's eviction. Once fallen back (a second device may lack
// pools the first had), every free is cudaFree, which also frees cudaMallocAsync's memory.
// CUDA IPC's slots (transport/cuda/ipc_peers.cc) stay cudaMalloc'd: cudaIpcGetMemHandle
// cannot export pool memory, and they live as long as their process set, off the op path.
namespace {

enum Mode : int { kUndecided = 0, kOrdered = 1, kFallback = 2 };
std::atomic<int> g_mode{kUndecided};

void fallBack(const char* why) {
  if (g_mode.exchange(kFallback) == kFallback) return;
  HVD_LOG(kWarning, "transport")
      << why << ": the core allocates its CUDA buffers with cudaMalloc, and frees a grown "
      << "fusion buffer or an evicted output block with cudaFree, which waits for the whole "
      << "device. Use CUDA 11.2 or newer on a device with memory pools to avoid it.";
}

}  // namespace

bool orderedFrees() { return g_mode.load() == kOrdered; }

int allocateOrdered(const CudaApi& cuda, CudaStream stream, size_t bytes, void** memory) {
  if (g_mode.load() != kFallback) {
    if (cuda.mallocAsync == nullptr || cuda.freeAsync == nullptr) {
      fallBack("this CUDA runtime has no stream-ordered allocator (cudaMallocAsync, CUDA 11.2)");
    } else {
      const int error = cuda.mallocAsync(memory, bytes, stream);
      if (error != kCudaErrorNotSupported) {
        if (error == kCudaSuccess) {
          int expected = kUndecided;
          g_mode.compare_exchange_strong(expected, kOrdered);
        }
        return error;
      }
      fallBack("cudaMallocAsync is not supported on this device (no memory pools)");
    }
  }
  return cuda.malloc(memory, bytes);
}

int freeOrdered(const CudaApi& cuda, CudaStream stream, void* memory) {
  if (memory == nullptr) return kCudaSuccess;
  return orderedFrees() ? cuda.freeAsync(memory, stream) : cuda.free(memory);
}

}  // namespace hvd::transport::nccl
