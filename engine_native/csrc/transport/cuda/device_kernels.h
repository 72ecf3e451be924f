// Reductions on the device by kernels compiled at run time: NVRTC compiles the kernel source of
// reduce_kernel_source.cc for the current device once (cached per device for the process's
// life) and the driver API loads and launches them. Nothing here includes a CUDA header or links
// CUDA: NVRTC and libcuda are dlopen'd (kernel_libraries.h). Called by the device path's
// executors (the CUDA-IPC allreduce, issue #19) on the background thread; thread-safe.
// Note [Device kernels] in device_kernels.cc says why NVRTC, what is cached and what the CPU
// fake (tests/fakecuda) proves.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"

namespace hvd::transport::cuda {

// One reduction, run on the device by a kernel compiled at run time.
// dst[i] = postscale * OP_{k<nsrcs}(prescale * srcs[k][i]) for i < count, where OP is
// kSum/kMin/kMax/kProduct (kAverage is the caller's job: kSum with postscale/n, as the CPU
// executor does; kAdasum is refused with a clear error). Scaling follows common/dtype.cc's
// scaleInPlace bit for bit (float32 multiplies by (float)factor, half types through float,
// integers as the CPU path does); float16/bfloat16 accumulate in float32 across all srcs and
// round once. srcs/dst are device pointers (peer-mapped IPC pointers allowed); dst may equal
// any srcs[k]. Queued on `stream` (a cudaStream_t); returns at once.
struct ReduceJob {
  common::DataType dtype;
  common::ReduceOp op;
  const void* const* srcs;   // host array of nsrcs device pointers
  int nsrcs;                 // 1..kMaxReduceSources
  void* dst;
  size_t count;              // elements
  double prescale = 1.0;
  double postscale = 1.0;
};
constexpr int kMaxReduceSources = 16;

// Loads NVRTC and the driver (first call; candidates as for the runtime, see below), compiles
// the kernels for the current device once (cached per device ordinal for the process's life).
// The error names what is missing and how to get it (e.g. "pip install nvidia-cuda-nvrtc-cu12").
common::Status deviceKernelsReady();
common::Status launchReduce(const ReduceJob& job, void* stream);

// The base of the device allocation block that holds `pointer` (cuMemGetAddressRange; loads the
// driver only). A caching allocator's pointer may sit inside a larger block, and CUDA IPC maps
// whole blocks (Note [IPC sub-allocation] in ipc_peers.cc).
common::Status allocationBase(const void* pointer, const void** base);
// The same block's base and size (also for a peer's block opened by CUDA IPC).
common::Status allocationRange(const void* pointer, const void** base, size_t* bytes);

// The libraries deviceKernelsReady() tries, in order. Only Python knows site-packages and
// torch's lib folder, so the caller passes them (engine_native.gpu.device_kernel_candidates,
// with its HVD_NVRTC_LIBRARY / HVD_CUDA_DRIVER_LIBRARY overrides). Until set, the bare sonames:
// libnvrtc.so.13, libnvrtc.so.12 and libcuda.so.1. Has no effect once a library is loaded.
void setDeviceKernelCandidates(std::vector<std::string> nvrtc, std::vector<std::string> driver);

// Compiles the kernel source for compute capability major.minor without a device: PTX for
// compute_XY (ptx = true) or a cubin for sm_XY, into *image. Needs NVRTC only (loaded from the
// candidates above). The error carries NVRTC's log.
common::Status compileReduceKernels(int major, int minor, bool ptx, std::string* image);

}  // namespace hvd::transport::cuda
