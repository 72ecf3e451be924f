// Device reductions compiled at run time (device_kernels.h).
//
// Note [Device kernels]: why NVRTC. The core is built without CUDA (DESIGN §3 "Boundary"), so
// it cannot carry fatbins for every GPU; PTX shipped in the package would tie it to one PTX ISA
// version and need the driver's JIT anyway. NVRTC (in the nvidia-cuda-nvrtc wheels and in every
// CUDA build of torch) compiles reduce_kernel_source.cc's source for exactly the device in use,
// to a cubin for sm_XY, which the driver loads without a JIT step (so a newer NVRTC than the
// driver still works within a CUDA major). Compiling costs ~1 s once per device and process:
// the module and its functions are cached per device ordinal and never unloaded (modules die
// with the context at exit). Options: --fmad=false so a*b+c is never fused (results then equal
// the CPU path's bit for bit), no fast math, denormals kept.
// What the CPU fake (tests/fakecuda/fake_nvrtc.cc, fake_cuda_driver.c) proves: this file's
// control flow (loading, errors, cache, argument packing, launch geometry, stream order) and
// the kernel source's arithmetic, which the fake compiles with the host compiler and runs
// thread by thread. What only a GPU proves: that NVRTC accepts it for a real architecture (the
// real-NVRTC test checks that without a GPU), the driver loads it, and the device arithmetic
// (FTZ, FMA contraction, conversions) matches (tests/gpu/test_device_kernels.py).
#include "transport/cuda/device_kernels.h"

#include <array>
#include <atomic>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "transport/cuda/kernel_compiler.h"
#include "transport/cuda/kernel_libraries.h"
#include "transport/cuda/reduce_kernel_source.h"
#include "transport/nccl/loader.h"

namespace hvd::transport::cuda {
namespace {

static_assert(sizeof(ReduceArgs) == 16 * 8 + 8 + 8 + 8 + 8 + 4 + 4, "ReduceArgs layout");
static_assert(offsetof(ReduceArgs, dst) == 128 && offsetof(ReduceArgs, nsrcs) == 160,
              "ReduceArgs must match HvdReduceArgs in the kernel source");

constexpr unsigned kBlockThreads = 256;   // = __launch_bounds__ in the source
constexpr uint64_t kMaxBlocks = 1024;     // grid-stride beyond: ~8 blocks per SM on an H100
constexpr int kMaxDevices = 64;
constexpr int kNumOps = 4;                // Sum, Min, Max, Product

struct DeviceModule {
  CuModule module = nullptr;
  std::array<std::array<CuFunction, kNumOps>, common::kNumDataTypes> functions{};
};

struct State {
  std::mutex candidates_mu;  // guards nvrtc, driver
  std::mutex build_mu;       // serialises module creation (compiling takes a while)
  std::vector<std::string> nvrtc{"libnvrtc.so.13", "libnvrtc.so.12"};
  std::vector<std::string> driver{"libcuda.so.1"};
  std::array<std::atomic<const DeviceModule*>, kMaxDevices> modules{};
};

State& state() {
  static State s;
  return s;
}

int opIndex(common::ReduceOp op) {
  switch (op) {
    case common::ReduceOp::kSum: return 0;
    case common::ReduceOp::kMin: return 1;
    case common::ReduceOp::kMax: return 2;
    case common::ReduceOp::kProduct: return 3;
    default: return -1;
  }
}

common::Status loadLibraries() {
  std::vector<std::string> nvrtc, driver;
  {
    std::lock_guard<std::mutex> lock(state().candidates_mu);
    nvrtc = state().nvrtc;
    driver = state().driver;
  }
  HVD_RETURN_IF_ERROR(loadCudaDriver(driver));  // first: NVRTC is checked against it
  return loadNvrtc(nvrtc);
}

// The current thread's context and its device. When the thread has none (no runtime call made
// it current yet), the runtime's current device's primary context is made current, as the
// runtime itself would do on its first call.
common::Status currentDevice(const DriverApi& cu, CuDevice* device) {
  HVD_RETURN_IF_ERROR(driverCall(cu, cu.init(0), "cuInit"));
  CuContext ctx = nullptr;
  HVD_RETURN_IF_ERROR(driverCall(cu, cu.ctxGetCurrent(&ctx), "cuCtxGetCurrent"));
  if (ctx == nullptr) {
    int ordinal = 0;
    const auto* rt = nccl::cudaApi();
    if (rt != nullptr && rt->getDevice(&ordinal) != 0) ordinal = 0;
    HVD_RETURN_IF_ERROR(
        driverCall(cu, cu.devicePrimaryCtxRetain(&ctx, ordinal), "cuDevicePrimaryCtxRetain"));
    HVD_RETURN_IF_ERROR(driverCall(cu, cu.ctxSetCurrent(ctx), "cuCtxSetCurrent"));
  }
  HVD_RETURN_IF_ERROR(driverCall(cu, cu.ctxGetDevice(device), "cuCtxGetDevice"));
  if (*device < 0 || *device >= kMaxDevices) {
    return common::internalError("device kernels: device ordinal " + std::to_string(*device) +
                                 " is beyond the " + std::to_string(kMaxDevices) + " supported");
  }
  return common::Status::ok();
}

common::Status buildModule(const DriverApi& cu, CuDevice device, DeviceModule* out) {
  int major = 0, minor = 0;
  HVD_RETURN_IF_ERROR(driverCall(
      cu, cu.deviceGetAttribute(&major, kCuDeviceAttributeComputeCapabilityMajor, device),
      "cuDeviceGetAttribute(compute capability major)"));
  HVD_RETURN_IF_ERROR(driverCall(
      cu, cu.deviceGetAttribute(&minor, kCuDeviceAttributeComputeCapabilityMinor, device),
      "cuDeviceGetAttribute(compute capability minor)"));
  std::string image;
  HVD_RETURN_IF_ERROR(compileReduceKernels(major, minor, /*ptx=*/false, &image));
  HVD_RETURN_IF_ERROR(driverCall(cu, cu.moduleLoadData(&out->module, image.data()),
                                 "cuModuleLoadData (the reduction kernels for sm_" +
                                     std::to_string(major) + std::to_string(minor) + ")"));
  for (int code = 0; code < common::kNumDataTypes; ++code) {
    for (const auto op : {common::ReduceOp::kSum, common::ReduceOp::kMin,
                          common::ReduceOp::kMax, common::ReduceOp::kProduct}) {
      const std::string name = reduceKernelName(static_cast<common::DataType>(code), op);
      HVD_RETURN_IF_ERROR(driverCall(
          cu, cu.moduleGetFunction(&out->functions[code][opIndex(op)], out->module, name.c_str()),
          "cuModuleGetFunction(" + name + ")"));
      int threads = 0;  // Note [Eager kernel loading]
      HVD_RETURN_IF_ERROR(driverCall(
          cu, cu.funcGetAttribute(&threads, kCuFuncAttributeMaxThreadsPerBlock,
                                  out->functions[code][opIndex(op)]),
          "cuFuncGetAttribute(" + name + ")"));
    }
  }
  HVD_LOG(kInfo, "transport") << "device reductions compiled for device " << device << " (sm_"
                              << major << minor << ") with " << nvrtcDescription();
  return common::Status::ok();
}

// Note [Eager kernel loading]
//   With CUDA's lazy loading (CUDA_MODULE_LOADING=LAZY, the default since 12.2) a function's
//   code is loaded at its first launch, which may synchronize the context — mid-training, the
//   first time a dtype/op pair is reduced. Querying an attribute of each function right after
//   cuModuleGetFunction forces the load here, at build time; cuFuncGetAttribute exists in
//   every driver we support (cuFuncLoad only from 12.4).

// The current device's module, compiled on first use.
common::Status currentModule(const DeviceModule** out) {
  HVD_RETURN_IF_ERROR(loadLibraries());
  const DriverApi& cu = *driverApi();
  CuDevice device = 0;
  HVD_RETURN_IF_ERROR(currentDevice(cu, &device));
  auto& slot = state().modules[device];
  *out = slot.load(std::memory_order_acquire);
  if (*out != nullptr) return common::Status::ok();
  std::lock_guard<std::mutex> lock(state().build_mu);
  *out = slot.load(std::memory_order_acquire);
  if (*out != nullptr) return common::Status::ok();
  auto built = std::make_unique<DeviceModule>();
  HVD_RETURN_IF_ERROR(buildModule(cu, device, built.get()));
  *out = built.release();  // Note [Device kernels]: never unloaded
  slot.store(*out, std::memory_order_release);
  return common::Status::ok();
}

common::Status checkJob(const ReduceJob& job) {
  const std::string what = "device reduction";
  HVD_RETURN_IF_ERROR(common::checkReducible(job.dtype, job.op));
  if (job.op == common::ReduceOp::kAverage) {
    return common::invalidArgument(what + ": Average is the caller's job: reduce with Sum and "
                                          "postscale = factor / n, as the CPU executor does");
  }
  if (job.nsrcs < 1 || job.nsrcs > kMaxReduceSources) {
    return common::invalidArgument(what + ": nsrcs must be 1.." +
                                   std::to_string(kMaxReduceSources) + ", got " +
                                   std::to_string(job.nsrcs) + "; split larger reductions");
  }
  if (job.count == 0) return common::Status::ok();
  if (job.srcs == nullptr || job.dst == nullptr) {
    return common::invalidArgument(what + ": srcs and dst must not be null");
  }
  for (int k = 0; k < job.nsrcs; ++k) {
    if (job.srcs[k] == nullptr) {
      return common::invalidArgument(what + ": srcs[" + std::to_string(k) + "] is null");
    }
  }
  return common::Status::ok();
}

}  // namespace

void setDeviceKernelCandidates(std::vector<std::string> nvrtc, std::vector<std::string> driver) {
  std::lock_guard<std::mutex> lock(state().candidates_mu);
  state().nvrtc = std::move(nvrtc);
  state().driver = std::move(driver);
}

common::Status compileReduceKernels(int major, int minor, bool ptx, std::string* image) {
  std::vector<std::string> nvrtc;
  {
    std::lock_guard<std::mutex> lock(state().candidates_mu);
    nvrtc = state().nvrtc;
  }
  HVD_RETURN_IF_ERROR(loadNvrtc(nvrtc));
  const std::string arch = std::string(ptx ? "compute_" : "sm_") + std::to_string(major) +
                           std::to_string(minor);
  return compileWithNvrtc(*nvrtcApi(), reduceKernelSource(), "hvd_reduce_kernels.cu",
                          {"--gpu-architecture=" + arch, "--std=c++17", "--fmad=false",
                           "--ftz=false", "--prec-div=true", "--prec-sqrt=true"},
                          ptx, image);
}

common::Status deviceKernelsReady() {
  const DeviceModule* module = nullptr;
  return currentModule(&module);
}

common::Status allocationBase(const void* pointer, const void** base) {
  size_t bytes = 0;
  return allocationRange(pointer, base, &bytes);
}

common::Status allocationRange(const void* pointer, const void** base, size_t* size) {
  std::vector<std::string> driver;
  {
    std::lock_guard<std::mutex> lock(state().candidates_mu);
    driver = state().driver;
  }
  HVD_RETURN_IF_ERROR(loadCudaDriver(driver));
  const DriverApi& cu = *driverApi();
  HVD_RETURN_IF_ERROR(driverCall(cu, cu.init(0), "cuInit"));
  unsigned long long start = 0;
  size_t bytes = 0;
  HVD_RETURN_IF_ERROR(driverCall(
      cu, cu.memGetAddressRange(&start, &bytes, reinterpret_cast<uintptr_t>(pointer)),
      "cuMemGetAddressRange"));
  *base = reinterpret_cast<const void*>(static_cast<uintptr_t>(start));
  *size = bytes;
  return common::Status::ok();
}

common::Status launchReduce(const ReduceJob& job, void* stream) {
  HVD_RETURN_IF_ERROR(checkJob(job));
  if (job.count == 0) return common::Status::ok();
  const DeviceModule* module = nullptr;
  HVD_RETURN_IF_ERROR(currentModule(&module));
  ReduceArgs args{};
  for (int k = 0; k < job.nsrcs; ++k) args.srcs[k] = job.srcs[k];
  args.dst = job.dst;
  args.count = job.count;
  args.prescale = job.prescale;
  args.postscale = job.postscale;
  args.nsrcs = job.nsrcs;
  args.identity = job.nsrcs == 1 && job.prescale == 1.0 && job.postscale == 1.0;
  const uint64_t blocks = (job.count + kBlockThreads - 1) / kBlockThreads;
  void* params[] = {&args};
  const auto& cu = *driverApi();
  CuFunction fn = module->functions[static_cast<int>(job.dtype)][opIndex(job.op)];
  const auto grid = static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
  return driverCall(cu, cu.launchKernel(fn, grid, 1, 1, kBlockThreads, 1, 1, 0, stream, params,
                                        nullptr),
                    "cuLaunchKernel(" + reduceKernelName(job.dtype, job.op) + ")");
}

}  // namespace hvd::transport::cuda
