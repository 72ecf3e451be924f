// Loading NVRTC and libcuda with dlopen (kernel_libraries.h). For each candidate, in order:
//   (a) a path that does not exist, or a soname the system loader cannot find: "not found";
//   (b) dlopen(RTLD_NOW | RTLD_LOCAL) — a corrupt file or a missing dependency fails here;
//   (c) the version entry point (nvrtcVersion / cuDriverGetVersion) must exist and answer;
//   (d) the version must be at least the minimum in api.h;
//   (e) every other symbol of the table must resolve;
//   (f) NVRTC only, once the driver is loaded: NVRTC's CUDA major version must not be newer
//       than the driver's — its cubins would not load (cuModuleLoadData) — so that an older
//       NVRTC later in the list (the CUDA 12 wheel beside torch's CUDA 13 one) is taken.
// As in transport/nccl/loader.cc, a rejected candidate is closed again and the first usable
// one is published and never closed (modules and launched kernels may outlive any caller).
#include "transport/cuda/kernel_libraries.h"

#include <dlfcn.h>
#include <sys/stat.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "common/logging.h"

namespace hvd::transport::cuda {
namespace {

// Resolves one table's symbols from one handle, remembering the missing ones.
class Binder {
 public:
  explicit Binder(void* handle) : handle_(handle) {}
  template <typename Fn>
  void bind(const char* name, Fn* slot) {
    void* symbol = dlsym(handle_, name);
    if (symbol == nullptr) {
      missing_ += (missing_.empty() ? "" : ", ") + std::string(name);
    } else {
      *slot = reinterpret_cast<Fn>(symbol);
    }
  }
  const std::string& missing() const { return missing_; }

 private:
  void* handle_;
  std::string missing_;
};

void bindNvrtc(Binder& b, NvrtcApi* api) {
  b.bind("nvrtcVersion", &api->version);
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

void bindDriver(Binder& b, DriverApi* api) {
  b.bind("cuDriverGetVersion", &api->driverGetVersion);
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

// nvrtcVersion(&major, &minor) and cuDriverGetVersion(&code), as one code 1000*major+10*minor.
int nvrtcVersionCode(NvrtcApi* api, int* code) {
  int major = 0, minor = 0;
  const int result = api->version(&major, &minor);
  *code = 1000 * major + 10 * minor;
  return result;
}

int driverVersionCode(DriverApi* api, int* code) { return api->driverGetVersion(code); }

std::string versionText(int code) {
  return std::to_string(code / 1000) + "." + std::to_string((code % 1000) / 10);
}

template <typename Api>
struct Library {
  Library(const char* title_, const char* version_symbol_, int min_version_, const char* fix_,
          void (*bind_)(Binder&, Api*), int (*version_)(Api*, int*),
          std::string (*compatible_)(int) = nullptr)
      : title(title_), version_symbol(version_symbol_), min_version(min_version_), fix(fix_),
        bind(bind_), version(version_), compatible(compatible_) {}
  const char* title;                     // "NVRTC", "the CUDA driver"
  const char* version_symbol;
  int min_version;
  const char* fix;                       // ends every error message
  void (*bind)(Binder&, Api*);
  int (*version)(Api*, int*);
  std::string (*compatible)(int code);  // (f): "" when usable here, else why not; may be null
  std::mutex mu;
  Api table;
  std::atomic<const Api*> published{nullptr};
  std::string description;
};

const DriverApi* loadedDriver();

// (f) for an NVRTC of version `code`.
std::string nvrtcMatchesDriver(int code) {
  const DriverApi* cu = loadedDriver();
  int driver = 0;
  if (cu == nullptr || cu->driverGetVersion(&driver) != 0) return "";
  if (code / 1000 <= driver / 1000) return "";
  return "is NVRTC " + versionText(code) + ", newer than the driver's CUDA " +
         versionText(driver) + " (the kernels it compiles would not load): update the NVIDIA "
         "driver, or let an NVRTC " + std::to_string(driver / 1000) + ".x come first "
         "(HVD_NVRTC_LIBRARY, or pip install nvidia-cuda-nvrtc-cu" +
         std::to_string(driver / 1000) + ")";
}

Library<NvrtcApi>& nvrtc() {
  static Library<NvrtcApi> lib{
      "NVRTC", "nvrtcVersion", kMinNvrtcVersion,
      "Device reductions compile their kernels at run time with NVRTC 11.2 or newer: pip "
      "install nvidia-cuda-nvrtc-cu12 (or nvidia-cuda-nvrtc for CUDA 13), or install a PyTorch "
      "build with CUDA (it ships libnvrtc), or set HVD_NVRTC_LIBRARY to a libnvrtc.so path.",
      &bindNvrtc, &nvrtcVersionCode, &nvrtcMatchesDriver};
  return lib;
}

Library<DriverApi>& driver() {
  static Library<DriverApi> lib{
      "the CUDA driver", "cuDriverGetVersion", kMinDriverVersion,
      "Device reductions need the NVIDIA driver's libcuda.so.1 (CUDA 11.2 or newer), which "
      "comes with the driver, not with pip: install or update the NVIDIA driver, or set "
      "HVD_CUDA_DRIVER_LIBRARY to the path of a libcuda.so.1.",
      &bindDriver, &driverVersionCode};
  return lib;
}

// One candidate through (a)-(e); "" on success (the table is filled), else why not.
template <typename Api>
std::string tryCandidate(Library<Api>& lib, const std::string& candidate, std::string* path) {
  const bool is_path = candidate.find('/') != std::string::npos;
  struct stat info;
  if (is_path && stat(candidate.c_str(), &info) != 0) return "not found";  // (a)
  dlerror();
  void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);  // (b)
  if (handle == nullptr) {
    const char* err = dlerror();
    const std::string text = err != nullptr ? err : "unknown dlopen error";
    if (!is_path && text.find("No such file") != std::string::npos) {
      return "not found on the system loader path";
    }
    return "cannot be loaded: " + text;
  }
  lib.table = Api();
  Binder binder(handle);
  lib.bind(binder, &lib.table);
  int code = 0;
  std::string why;
  if (dlsym(handle, lib.version_symbol) == nullptr) {  // (c)
    why = std::string("is not ") + lib.title + " (it has no " + lib.version_symbol + ")";
  } else if (lib.version(&lib.table, &code) != 0) {
    why = std::string(lib.version_symbol) + " failed";
  } else if (code < lib.min_version) {  // (d)
    why = "is " + std::string(lib.title) + " " + versionText(code) + "; this core needs " +
          versionText(lib.min_version) + " or newer";
  } else if (!binder.missing().empty()) {  // (e)
    why = "is " + std::string(lib.title) + " " + versionText(code) + " but lacks " +
          binder.missing();
  } else if (lib.compatible != nullptr) {  // (f)
    why = lib.compatible(code);
  }
  if (!why.empty()) {
    dlclose(handle);
    return why;
  }
  Dl_info where;
  void* any = dlsym(handle, lib.version_symbol);
  *path = dladdr(any, &where) != 0 && where.dli_fname != nullptr ? where.dli_fname : candidate;
  *path = versionText(code) + " from " + *path;
  return "";
}

template <typename Api>
common::Status load(Library<Api>& lib, const std::vector<std::string>& candidates) {
  std::lock_guard<std::mutex> lock(lib.mu);
  if (lib.published.load(std::memory_order_acquire) != nullptr) return common::Status::ok();
  std::string tried;
  for (const auto& candidate : candidates) {
    std::string description;
    const std::string why = tryCandidate(lib, candidate, &description);
    if (why.empty()) {
      lib.description = std::string(lib.title) + " " + description;
      lib.published.store(&lib.table, std::memory_order_release);
      HVD_LOG(kInfo, "transport") << "loaded " << lib.description;
      return common::Status::ok();
    }
    HVD_LOG(kDebug, "transport") << lib.title << ": " << candidate << " " << why;
    tried += (tried.empty() ? "" : "; ") + candidate + " " + why;
  }
  const std::string head = tried.empty() ? std::string(lib.title) + " was not found: no "
                                                                    "candidate library was given."
                                         : std::string("No usable ") + lib.title + ": " + tried +
                                               ".";
  return common::internalError(head + " " + lib.fix);
}

}  // namespace

common::Status loadNvrtc(const std::vector<std::string>& candidates) {
  return load(nvrtc(), candidates);
}

common::Status loadCudaDriver(const std::vector<std::string>& candidates) {
  return load(driver(), candidates);
}

namespace {
const DriverApi* loadedDriver() { return driver().published.load(std::memory_order_acquire); }
}  // namespace

const NvrtcApi* nvrtcApi() { return nvrtc().published.load(std::memory_order_acquire); }
const DriverApi* driverApi() { return driver().published.load(std::memory_order_acquire); }

std::string nvrtcDescription() {
  std::lock_guard<std::mutex> lock(nvrtc().mu);
  return nvrtc().description;
}

std::string driverDescription() {
  std::lock_guard<std::mutex> lock(driver().mu);
  return driver().description;
}

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
