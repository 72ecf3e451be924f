// The CUDA C++ source of the device reductions (reduce_kernel_source.cc), compiled at run time
// by device_kernels.cc with NVRTC, and on the CPU by the test fake (tests/fakecuda). One kernel
// per (dtype, op), extern "C" so that its name is the symbol; each takes one ReduceArgs by value.
#pragma once

#include <cstdint>
#include <string>

#include "common/dtype.h"

namespace hvd::transport::cuda {

// The kernels' only parameter; the source declares the same struct (HvdReduceArgs) field by
// field, so the layout matches on both sides (static_asserts in device_kernels.cc).
struct ReduceArgs {
  const void* srcs[16];      // kMaxReduceSources
  void* dst;
  uint64_t count;
  double prescale;
  double postscale;
  int32_t nsrcs;
  int32_t identity;          // 1: one source, no scaling: copy the bits (as the CPU path does)
};

// The whole translation unit: helpers, the templated body and the extern "C" kernels.
const std::string& reduceKernelSource();

// "hvd_reduce_float32_sum": the kernel for `dtype` and `op` (Sum, Min, Max or Product).
std::string reduceKernelName(common::DataType dtype, common::ReduceOp op);

}  // namespace hvd::transport::cuda
