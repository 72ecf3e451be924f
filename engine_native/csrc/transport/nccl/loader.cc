// Loading NCCL and the CUDA runtime with dlopen (loader.h). For each candidate, in order:
//   (a) a path that does not exist, or a name the system loader cannot find, is "not found";
//   (b) dlopen(RTLD_NOW | RTLD_LOCAL) — a corrupt file or a missing dependency fails here;
//   (c) the version entry point (ncclGetVersion / cudaRuntimeGetVersion) must exist and answer;
//   (d) the version must be at least the minimum in api.h;
//   (e) every other symbol of the table must resolve.
// A candidate failing (b)-(e) is closed again (nothing of it has run but its version query), so
// a later bare-name candidate with the same soname cannot pick it up. The first candidate that
// passes is published and never closed: streams and communicators may outlive any caller.
#include "transport/nccl/loader.h"

#include <dlfcn.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "common/logging.h"

namespace hvd::transport::nccl {
namespace {

// Resolves the symbols of one table from one handle, remembering the missing ones.
class SymbolBinder {
 public:
  explicit SymbolBinder(void* handle) : handle_(handle) {}

  template <typename Fn>
  void bind(const char* name, Fn* slot) {
    void* symbol = dlsym(handle_, name);
    if (symbol == nullptr) {
      missing_.push_back(name);
    } else {
      *slot = reinterpret_cast<Fn>(symbol);
    }
  }

  // A symbol the caller can do without (its slot stays nullptr).
  template <typename Fn>
  void bindOptional(const char* name, Fn* slot) {
    void* symbol = dlsym(handle_, name);
    if (symbol != nullptr) *slot = reinterpret_cast<Fn>(symbol);
  }

  std::string missingList() const {
    std::string out;
    for (const auto& name : missing_) out += (out.empty() ? "" : ", ") + name;
    return out;
  }
  bool complete() const { return missing_.empty(); }

 private:
  void* handle_;
  std::vector<std::string> missing_;
};

void bindNccl(SymbolBinder& b, NcclApi* api) {
  b.bind("ncclGetErrorString", &api->getErrorString);
  b.bind("ncclGetUniqueId", &api->getUniqueId);
  b.bind("ncclCommInitRank", &api->commInitRank);
  b.bind("ncclCommDestroy", &api->commDestroy);
  b.bind("ncclCommAbort", &api->commAbort);
  b.bind("ncclCommGetAsyncError", &api->commGetAsyncError);
  b.bind("ncclAllReduce", &api->allReduce);
  b.bind("ncclBroadcast", &api->broadcast);
  b.bind("ncclAllGather", &api->allGather);
  b.bind("ncclReduceScatter", &api->reduceScatter);
  b.bind("ncclSend", &api->send);
  b.bind("ncclRecv", &api->recv);
  b.bind("ncclReduce", &api->reduce);
  b.bind("ncclGroupStart", &api->groupStart);
  b.bind("ncclGroupEnd", &api->groupEnd);
  b.bindOptional("ncclRedOpCreatePreMulSum", &api->redOpCreatePreMulSum);
  b.bindOptional("ncclRedOpDestroy", &api->redOpDestroy);
}

void bindCuda(SymbolBinder& b, CudaApi* api) {
  b.bind("cudaDriverGetVersion", &api->driverGetVersion);
  b.bind("cudaGetDeviceCount", &api->getDeviceCount);
  b.bind("cudaGetDevice", &api->getDevice);
  b.bind("cudaSetDevice", &api->setDevice);
  b.bind("cudaGetErrorString", &api->getErrorString);
  b.bind("cudaDeviceGetPCIBusId", &api->deviceGetPciBusId);
  b.bind("cudaStreamCreateWithFlags", &api->streamCreateWithFlags);
  b.bind("cudaStreamDestroy", &api->streamDestroy);
  b.bind("cudaStreamSynchronize", &api->streamSynchronize);
  b.bind("cudaStreamWaitEvent", &api->streamWaitEvent);
  b.bind("cudaEventCreateWithFlags", &api->eventCreateWithFlags);
  b.bind("cudaEventRecord", &api->eventRecord);
  b.bind("cudaEventQuery", &api->eventQuery);
  b.bind("cudaEventDestroy", &api->eventDestroy);
  b.bind("cudaMalloc", &api->malloc);
  b.bind("cudaFree", &api->free);
  b.bind("cudaMallocHost", &api->mallocHost);
  b.bind("cudaFreeHost", &api->freeHost);
  b.bind("cudaMemcpyAsync", &api->memcpyAsync);
  b.bind("cudaMemsetAsync", &api->memsetAsync);
  b.bind("cudaLaunchHostFunc", &api->launchHostFunc);
  b.bindOptional("cudaIpcGetMemHandle", &api->ipcGetMemHandle);
  b.bindOptional("cudaIpcOpenMemHandle", &api->ipcOpenMemHandle);
  b.bindOptional("cudaIpcCloseMemHandle", &api->ipcCloseMemHandle);
  b.bindOptional("cudaIpcGetEventHandle", &api->ipcGetEventHandle);
  b.bindOptional("cudaIpcOpenEventHandle", &api->ipcOpenEventHandle);
}

// What differs between the two libraries; the procedure (a)-(e) is shared.
struct LibrarySpec {
  const char* what;          // "NCCL" / "the CUDA runtime", as in "is NCCL 2.8.4"
  const char* title;         // "NCCL" / "CUDA runtime", as in "No usable NCCL: ..."
  const char* version_symbol;
  int min_version;
  std::string (*version_text)(int);
  const char* fix;           // how to get a usable one; ends the error message
  // Binds the rest of the table from `binder`; `version_fn` is the resolved version symbol.
  std::function<void(SymbolBinder&, void* version_fn)> bind_rest;
};

bool isPath(const std::string& candidate) { return candidate.find('/') != std::string::npos; }

std::string absolute(const char* path) {
  if (path == nullptr || path[0] == '\0') return "";
  if (path[0] == '/') return path;
  char cwd[4096];
  if (getcwd(cwd, sizeof(cwd)) == nullptr) return path;
  return std::string(cwd) + "/" + path;
}

std::string versionPhrase(const LibrarySpec& spec, int version) {
  return spec.version_text(version) + " (version code " + std::to_string(version) + ")";
}

// One candidate through steps (a)-(e). On success returns the handle, the resolved path and
// the version; on failure nullptr and *rejection filled in.
void* tryCandidate(const LibrarySpec& spec, const std::string& candidate, std::string* path,
                   int* version, Rejection* rejection) {
  rejection->candidate = candidate;
  struct stat info;
  if (isPath(candidate) && stat(candidate.c_str(), &info) != 0) {  // (a)
    rejection->reason = "not found";
    rejection->not_found = true;
    return nullptr;
  }
  dlerror();
  void* handle = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);  // (b)
  if (handle == nullptr) {
    const char* err = dlerror();
    std::string text = err != nullptr ? err : "unknown dlopen error";
    rejection->not_found = !isPath(candidate) && text.find("No such file") != std::string::npos;
    rejection->reason = rejection->not_found ? "not found on the system loader path"
                                             : "cannot be loaded: " + text;
    return nullptr;
  }
  auto reject = [&](std::string reason) -> void* {
    rejection->reason = std::move(reason);
    dlclose(handle);
    return nullptr;
  };
  void* version_fn = dlsym(handle, spec.version_symbol);  // (c)
  if (version_fn == nullptr) {
    return reject(std::string("is not ") + spec.what + " (it has no " + spec.version_symbol +
                  ")");
  }
  Dl_info where;
  *path = absolute(dladdr(version_fn, &where) != 0 ? where.dli_fname : candidate.c_str());
  int code = 0;
  const int result = reinterpret_cast<int (*)(int*)>(version_fn)(&code);
  if (result != 0) {
    return reject(std::string(spec.version_symbol) + " failed (error " +
                  std::to_string(result) + ")");
  }
  if (code < spec.min_version) {  // (d)
    return reject("is " + std::string(spec.what) + " " + versionPhrase(spec, code) +
                  "; this core needs " + spec.what + " " + spec.version_text(spec.min_version) +
                  " or newer");
  }
  SymbolBinder binder(handle);  // (e)
  spec.bind_rest(binder, version_fn);
  if (!binder.complete()) {
    return reject("is " + std::string(spec.what) + " " + versionPhrase(spec, code) +
                  " but lacks " + binder.missingList());
  }
  *version = code;
  return handle;
}

std::string failureMessage(const LibrarySpec& spec, const std::vector<Rejection>& rejected) {
  std::string missing, unusable;
  for (const auto& r : rejected) {
    if (r.not_found) {
      missing += (missing.empty() ? "" : ", ") + r.candidate;
    } else {
      unusable += (unusable.empty() ? "" : "; ") + r.candidate + " " + r.reason;
    }
  }
  std::string out;
  if (rejected.empty()) {
    out = std::string(spec.title) + " was not found: no candidate library was given.";
  } else if (unusable.empty()) {
    out = std::string(spec.title) + " was not found (looked for " + missing + ").";
  } else {
    out = std::string("No usable ") + spec.title + ": " + unusable + ".";
    if (!missing.empty()) out += " Also looked for " + missing + ".";
  }
  return out + " " + spec.fix;
}

// One loader's state: the published table, and the last result for reports.
template <typename Api>
struct Slot {
  std::mutex mu;
  Api table;
  std::atomic<const Api*> published{nullptr};
  LoadResult last;
};

template <typename Api>
LoadResult load(Slot<Api>& slot, const LibrarySpec& spec,
                const std::vector<std::string>& candidates) {
  std::lock_guard<std::mutex> lock(slot.mu);
  if (slot.published.load(std::memory_order_acquire) != nullptr) return slot.last;
  LoadResult result;
  for (const auto& candidate : candidates) {
    Rejection rejection;
    std::string path;
    int version = 0;
    if (tryCandidate(spec, candidate, &path, &version, &rejection) == nullptr) {
      HVD_LOG(kDebug, "transport") << spec.title << ": " << candidate << " " << rejection.reason;
      result.rejected.push_back(std::move(rejection));
      continue;
    }
    result.ok = true;
    result.path = path;
    result.version = version;
    for (const auto& r : result.rejected) {
      if (!r.not_found) {
        HVD_LOG(kWarning, "transport") << spec.title << ": skipped " << r.candidate << " ("
                                       << r.reason << ")";
      }
    }
    HVD_LOG(kInfo, "transport") << "loaded " << spec.what << " " << spec.version_text(version)
                                << " from " << path;
    slot.last = result;
    slot.published.store(&slot.table, std::memory_order_release);
    return result;
  }
  result.error = failureMessage(spec, result.rejected);
  slot.last = result;
  return result;
}

Slot<NcclApi>& ncclSlot() {
  static Slot<NcclApi> slot;
  return slot;
}

Slot<CudaApi>& cudaSlot() {
  static Slot<CudaApi> slot;
  return slot;
}

const LibrarySpec& ncclSpec() {
  static const LibrarySpec spec{
      "NCCL", "NCCL", "ncclGetVersion", kMinNcclVersion, &ncclVersionText,
      "CUDA tensors need NCCL 2.10 or newer: pip install \"hvd-magic[gpu]\" (the "
      "nvidia-nccl-cu12 wheel), or install a PyTorch build with CUDA, or set "
      "HVD_NCCL_LIBRARY to the path of a libnccl.so.2.",
      [](SymbolBinder& binder, void* version_fn) {
        NcclApi& api = ncclSlot().table;
        api = NcclApi();
        api.getVersion = reinterpret_cast<NcclGetVersionFn>(version_fn);
        bindNccl(binder, &api);
      }};
  return spec;
}

const LibrarySpec& cudaSpec() {
  static const LibrarySpec spec{
      "the CUDA runtime", "CUDA runtime", "cudaRuntimeGetVersion", kMinCudaRuntimeVersion,
      &cudaVersionText,
      "CUDA tensors need the CUDA runtime 11.0 or newer: pip install nvidia-cuda-runtime-cu12, "
      "or install a PyTorch build with CUDA, or set HVD_CUDA_RUNTIME_LIBRARY to the path of a "
      "libcudart.so.",
      [](SymbolBinder& binder, void* version_fn) {
        CudaApi& api = cudaSlot().table;
        api = CudaApi();
        api.runtimeGetVersion = reinterpret_cast<CudaIntOutFn>(version_fn);
        bindCuda(binder, &api);
      }};
  return spec;
}

}  // namespace

// The tables are only written under the slot's mutex and before publication; a failed
// candidate's partial table is overwritten by the next candidate and never published.
LoadResult loadNccl(const std::vector<std::string>& candidates) {
  return load(ncclSlot(), ncclSpec(), candidates);
}

LoadResult loadCudaRuntime(const std::vector<std::string>& candidates) {
  return load(cudaSlot(), cudaSpec(), candidates);
}

LoadResult ncclLoadState() {
  std::lock_guard<std::mutex> lock(ncclSlot().mu);
  return ncclSlot().last;
}

LoadResult cudaRuntimeLoadState() {
  std::lock_guard<std::mutex> lock(cudaSlot().mu);
  return cudaSlot().last;
}

const NcclApi* ncclApi() { return ncclSlot().published.load(std::memory_order_acquire); }
const CudaApi* cudaApi() { return cudaSlot().published.load(std::memory_order_acquire); }

std::string ncclVersionText(int code) {
  if (code <= 0) return "unknown";
  const int major = code >= 10000 ? code / 10000 : code / 1000;
  const int minor = code >= 10000 ? (code % 10000) / 100 : (code % 1000) / 100;
  return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(code % 100);
}

std::string cudaVersionText(int code) {
  if (code <= 0) return "unknown";
  return std::to_string(code / 1000) + "." + std::to_string((code % 1000) / 10);
}

}  // namespace hvd::transport::nccl
