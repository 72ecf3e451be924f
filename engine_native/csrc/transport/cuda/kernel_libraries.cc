// Loading NVRTC and libcuda (kernel_libraries.h): their tables, version entry points, fixes,
// and one check of their own — NVRTC's CUDA major version must not be newer than the driver's,
// or its cubins would not load (cuModuleLoadData); so an older NVRTC later in the list (the
// CUDA 12 wheel beside torch's CUDA 13 one) is taken. The search itself is
// transport/dynamic_library.cc's, shared with NCCL and the CUDA runtime.
#include "transport/cuda/kernel_libraries.h"

#include <string>
#include <vector>

#include "transport/dynamic_library.h"
#include "transport/nccl/loader.h"

namespace hvd::transport::cuda {
namespace {

void bindNvrtc(SymbolBinder& b, NvrtcApi* api) {
  b.bind(kNvrtcVersionSymbol, &api->version);
  b.bind("nvrtcGetErrorString", &api->getErrorString);
  b.bind("nvrtcCreateProgram", &api->createProgram);
  b.bind("nvrtcCompileProgram", &api->compileProgram);
  b.bind("nvrtcDestroyProgram", &api->destroyProgram);
  b.bind("nvrtcGetProgramLogSize", &api->getProgramLogSize);
  b.bind("nvrtcGetProgramLog", &api->getProgramLog);
  b.bind("nvrtcGetPTXSize", &api->getPtxSize);
  b.bind("nvrtcGetPTX", &api->getPtx);
  b.bind("nvrtcGetCUBINSize", &api->getCubinSize);
  b.bind("nvrtcGetCUBIN", &api->getCubin);
}

void bindDriver(SymbolBinder& b, DriverApi* api) {
  b.bind(kDriverVersionSymbol, &api->driverGetVersion);
  b.bind("cuInit", &api->init);
  b.bind("cuGetErrorString", &api->getErrorString);
  b.bind("cuGetErrorName", &api->getErrorName);
  b.bind("cuCtxGetCurrent", &api->ctxGetCurrent);
  b.bind("cuCtxSetCurrent", &api->ctxSetCurrent);
  b.bind("cuCtxGetDevice", &api->ctxGetDevice);
  b.bind("cuDevicePrimaryCtxRetain", &api->devicePrimaryCtxRetain);
  b.bind("cuDeviceGetAttribute", &api->deviceGetAttribute);
  b.bind("cuModuleLoadData", &api->moduleLoadData);
  b.bind("cuModuleGetFunction", &api->moduleGetFunction);
  b.bind("cuLaunchKernel", &api->launchKernel);
  b.bind("cuFuncGetAttribute", &api->funcGetAttribute);
  b.bind("cuMemGetAddressRange_v2", &api->memGetAddressRange);  // cuda.h's name for it
}

// nvrtcVersion(&major, &minor), as one code 1000 * major + 10 * minor like the driver's.
int nvrtcVersionCode(void* version_fn, int* code) {
  int major = 0, minor = 0;
  const int result = reinterpret_cast<NvrtcVersionFn>(version_fn)(&major, &minor);
  *code = 1000 * major + 10 * minor;
  return result;
}

std::string nvrtcMatchesDriver(int code);

DynamicLibrary<NvrtcApi>& nvrtc() {
  static DynamicLibrary<NvrtcApi> library(
      {"NVRTC", "NVRTC", kNvrtcVersionSymbol, kMinNvrtcVersion, &nccl::cudaVersionText,
       &nvrtcVersionCode, &nvrtcMatchesDriver,
       "Device reductions compile their kernels at run time with NVRTC 11.2 or newer: pip "
       "install nvidia-cuda-nvrtc-cu12 (or nvidia-cuda-nvrtc for CUDA 13), or install a "
       "PyTorch build with CUDA (it ships libnvrtc), or set HVD_NVRTC_LIBRARY to a libnvrtc.so "
       "path."},
      &bindNvrtc);
  return library;
}

DynamicLibrary<DriverApi>& driver() {
  static DynamicLibrary<DriverApi> library(
      {"the CUDA driver", "CUDA driver", kDriverVersionSymbol, kMinDriverVersion,
       &nccl::cudaVersionText, nullptr, nullptr,
       "Device reductions need the NVIDIA driver's libcuda.so.1 (CUDA 11.2 or newer), which "
       "comes with the driver, not with pip: install or update the NVIDIA driver, or set "
       "HVD_CUDA_DRIVER_LIBRARY to the path of a libcuda.so.1."},
      &bindDriver);
  return library;
}

// The NVRTC-only check, for an NVRTC of version `code` (nothing to check before the driver
// is loaded: device_kernels.cc loads it first).
std::string nvrtcMatchesDriver(int code) {
  const DriverApi* cu = driver().api();
  int driver_code = 0;
  if (cu == nullptr || cu->driverGetVersion(&driver_code) != 0) return "";
  if (code / 1000 <= driver_code / 1000) return "";
  const std::string major = std::to_string(driver_code / 1000);
  return "is NVRTC " + nccl::cudaVersionText(code) + ", newer than the driver's CUDA " +
         nccl::cudaVersionText(driver_code) + " (the kernels it compiles would not load): "
         "update the NVIDIA driver, or let an NVRTC " + major + ".x come first "
         "(HVD_NVRTC_LIBRARY, or pip install nvidia-cuda-nvrtc-cu" + major + ")";
}

common::Status toStatus(const LoadResult& result) {
  return result.ok ? common::Status::ok() : common::internalError(result.error);
}

// "NVRTC 12.9 from /path", or "" before a successful load.
template <typename Api>
std::string describe(DynamicLibrary<Api>& library) {
  const LoadResult last = library.lastResult();
  if (!last.ok) return "";
  return std::string(library.spec().what) + " " + library.spec().version_text(last.version) +
         " from " + last.path;
}

}  // namespace

common::Status loadNvrtc(const std::vector<std::string>& candidates) {
  return toStatus(nvrtc().load(candidates));
}

common::Status loadCudaDriver(const std::vector<std::string>& candidates) {
  return toStatus(driver().load(candidates));
}

const NvrtcApi* nvrtcApi() { return nvrtc().api(); }
const DriverApi* driverApi() { return driver().api(); }

std::string nvrtcDescription() { return describe(nvrtc()); }
std::string driverDescription() { return describe(driver()); }

common::Status driverCall(const DriverApi& cu, int result, const std::string& what) {
  if (result == kCuSuccess) return common::Status::ok();
  const char* name = nullptr;
  const char* text = nullptr;
  if (cu.getErrorName(result, &name) != kCuSuccess || name == nullptr) name = "CUDA error";
  if (cu.getErrorString(result, &text) != kCuSuccess || text == nullptr) text = "unknown";
  return common::internalError(what + " failed: " + name + " (" + std::to_string(result) +
                               ": " + text + ")");
}

}  // namespace hvd::transport::cuda
