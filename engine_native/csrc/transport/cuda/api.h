// The slice of NVRTC (nvrtc.h) and the CUDA driver API (cuda.h) that the device kernels use,
// declared as opaque handles and function-pointer types so that no CUDA header is included
// (DESIGN §3 "Boundary"), as transport/nccl/api.h does for NCCL and the runtime. The loader
// (kernel_libraries.h) fills the tables with dlsym; they never change once published.
//
// Note [Stable C ABI] (transport/nccl/api.h) holds here too: these entry points and values are
// frozen in nvrtc.h (11.2+) and cuda.h (the _v2 names are what cuda.h's macros select).
#pragma once

#include <cstddef>

namespace hvd::transport::cuda {

// ---- NVRTC --------------------------------------------------------------------------------
struct NvrtcProgramOpaque;
using NvrtcProgram = NvrtcProgramOpaque*;   // nvrtcProgram
constexpr int kNvrtcSuccess = 0;            // nvrtcResult
constexpr int kNvrtcErrorCompilation = 6;
// nvrtcVersion answers (major, minor); 11.2 is the first with nvrtcGetCUBIN and sm_XY targets.
constexpr int kMinNvrtcVersion = 11020;     // 1000 * major + 10 * minor, as the runtime's codes
constexpr char kNvrtcVersionSymbol[] = "nvrtcVersion";

using NvrtcVersionFn = int (*)(int* major, int* minor);
using NvrtcGetErrorStringFn = const char* (*)(int result);
using NvrtcCreateProgramFn = int (*)(NvrtcProgram* prog, const char* src, const char* name,
                                     int num_headers, const char* const* headers,
                                     const char* const* include_names);
using NvrtcCompileProgramFn = int (*)(NvrtcProgram prog, int num_options,
                                      const char* const* options);
using NvrtcDestroyProgramFn = int (*)(NvrtcProgram* prog);
using NvrtcSizeFn = int (*)(NvrtcProgram prog, size_t* size);  // log / PTX / CUBIN sizes
using NvrtcGetBytesFn = int (*)(NvrtcProgram prog, char* out);  // log / PTX / CUBIN

struct NvrtcApi {
  NvrtcVersionFn version = nullptr;
  NvrtcGetErrorStringFn getErrorString = nullptr;
  NvrtcCreateProgramFn createProgram = nullptr;
  NvrtcCompileProgramFn compileProgram = nullptr;
  NvrtcDestroyProgramFn destroyProgram = nullptr;
  NvrtcSizeFn getProgramLogSize = nullptr;
  NvrtcGetBytesFn getProgramLog = nullptr;
  NvrtcSizeFn getPtxSize = nullptr;
  NvrtcGetBytesFn getPtx = nullptr;
  NvrtcSizeFn getCubinSize = nullptr;
  NvrtcGetBytesFn getCubin = nullptr;
};

// ---- CUDA driver --------------------------------------------------------------------------
struct CuContextOpaque;
using CuContext = CuContextOpaque*;          // CUcontext
struct CuModuleOpaque;
using CuModule = CuModuleOpaque*;            // CUmodule
struct CuFunctionOpaque;
using CuFunction = CuFunctionOpaque*;        // CUfunction
using CuDevice = int;                        // CUdevice
using CuStream = void*;                      // CUstream == cudaStream_t
constexpr int kCuSuccess = 0;                // CUresult
constexpr int kCuDeviceAttributeComputeCapabilityMajor = 75;  // CUdevice_attribute
constexpr int kCuDeviceAttributeComputeCapabilityMinor = 76;
constexpr int kMinDriverVersion = 11020;     // cuDriverGetVersion: 1000 * major + 10 * minor
constexpr char kDriverVersionSymbol[] = "cuDriverGetVersion";

using CuIntOutFn = int (*)(int* value);      // cuDriverGetVersion
using CuInitFn = int (*)(unsigned flags);
using CuGetErrorStringFn = int (*)(int result, const char** text);  // also cuGetErrorName
using CuCtxGetCurrentFn = int (*)(CuContext* ctx);
using CuCtxSetCurrentFn = int (*)(CuContext ctx);
using CuCtxGetDeviceFn = int (*)(CuDevice* device);
using CuDevicePrimaryCtxRetainFn = int (*)(CuContext* ctx, CuDevice device);
using CuDeviceGetAttributeFn = int (*)(int* value, int attribute, CuDevice device);
using CuModuleLoadDataFn = int (*)(CuModule* module, const void* image);
using CuModuleGetFunctionFn = int (*)(CuFunction* fn, CuModule module, const char* name);
using CuMemGetAddressRangeFn = int (*)(unsigned long long* base, size_t* bytes,
                                      unsigned long long pointer);  // _v2: CUdeviceptr
using CuFuncGetAttributeFn = int (*)(int* value, int attribute, CuFunction fn);
constexpr int kCuFuncAttributeMaxThreadsPerBlock = 0;  // CUfunction_attribute
using CuLaunchKernelFn = int (*)(CuFunction fn, unsigned grid_x, unsigned grid_y,
                                 unsigned grid_z, unsigned block_x, unsigned block_y,
                                 unsigned block_z, unsigned shared_bytes, CuStream stream,
                                 void** params, void** extra);

struct DriverApi {
  CuIntOutFn driverGetVersion = nullptr;
  CuInitFn init = nullptr;
  CuGetErrorStringFn getErrorString = nullptr;
  CuGetErrorStringFn getErrorName = nullptr;
  CuCtxGetCurrentFn ctxGetCurrent = nullptr;
  CuCtxSetCurrentFn ctxSetCurrent = nullptr;
  CuCtxGetDeviceFn ctxGetDevice = nullptr;
  CuDevicePrimaryCtxRetainFn devicePrimaryCtxRetain = nullptr;
  CuDeviceGetAttributeFn deviceGetAttribute = nullptr;
  CuModuleLoadDataFn moduleLoadData = nullptr;
  CuModuleGetFunctionFn moduleGetFunction = nullptr;
  CuLaunchKernelFn launchKernel = nullptr;
  CuFuncGetAttributeFn funcGetAttribute = nullptr;
  CuMemGetAddressRangeFn memGetAddressRange = nullptr;
};

}  // namespace hvd::transport::cuda
