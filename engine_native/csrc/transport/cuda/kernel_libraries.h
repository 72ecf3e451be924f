// Finds NVRTC and the CUDA driver (libcuda) with dlopen and publishes their function tables
// (api.h), for the device kernels (device_kernels.h), through the same search and reports as
// NCCL and the runtime (transport/dynamic_library.h): candidates in order, every rejected one
// named with its reason, a version check, every symbol required. Thread-safe; a loaded library
// is never unloaded; after a failure the next call tries again.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "transport/cuda/api.h"

namespace hvd::transport::cuda {

// Candidates as in transport/dynamic_library.h: a path when it contains '/', else a soname for
// the system loader. On success the table is published (nvrtcApi()/driverApi() return it); on
// failure the Status names every candidate tried and how to get a usable library.
common::Status loadNvrtc(const std::vector<std::string>& candidates);
common::Status loadCudaDriver(const std::vector<std::string>& candidates);

// nullptr until the matching load succeeded, then the same pointer for the process's life.
const NvrtcApi* nvrtcApi();
const DriverApi* driverApi();

// "NVRTC 12.9 from /path" / "the CUDA driver 12.8 from /path", or "" before a load.
std::string nvrtcDescription();
std::string driverDescription();

// ok when `result` is CUDA_SUCCESS, else an internal error naming `what` and the driver's
// name and text for the result ("cuLaunchKernel(...) failed: CUDA_ERROR_INVALID_VALUE (...)").
common::Status driverCall(const DriverApi& cu, int result, const std::string& what);

}  // namespace hvd::transport::cuda
