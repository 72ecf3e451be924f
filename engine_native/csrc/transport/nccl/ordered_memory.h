// Device memory allocated and freed in a stream's order (cudaMallocAsync/cudaFreeAsync), so
// that no buffer the core owns is freed with cudaFree on the op path: cudaFree waits for the
// whole device. Used by DeviceStream's buffers and by runtime/device_output_pool.cc, on the
// thread that queues work on the stream (the background loop, or a caller driving it).
// Note [Ordered device memory] in ordered_memory.cc says when the cudaMalloc fallback is used.
#pragma once

#include <cstddef>

#include "transport/nccl/api.h"

namespace hvd::transport::nccl {

// Whether frees are stream-ordered in this process: false before the first allocation
// decided it, and for good once the fallback was taken.
bool orderedFrees();

// `bytes` of the current device's memory, usable by work queued on `stream` from now on
// (cudaMallocAsync, or cudaMalloc in the fallback). Returns a cudaError_t.
int allocateOrdered(const CudaApi& cuda, CudaStream stream, size_t bytes, void** memory);

// Frees `memory` once `stream` reached everything queued on it so far (cudaFreeAsync), or at
// once after waiting for the whole device (cudaFree, the fallback). Returns a cudaError_t.
int freeOrdered(const CudaApi& cuda, CudaStream stream, void* memory);

}  // namespace hvd::transport::nccl
