// Loading NCCL and the CUDA runtime (loader.h): their tables, version entry points and fixes.
// The search itself — candidates in order, each rejected one named with its reason, one error
// when none is usable — is transport/dynamic_library.cc's, shared with NVRTC and the driver.
#include "transport/nccl/loader.h"

#include <string>
#include <vector>

namespace hvd::transport::nccl {
namespace {

void bindNccl(SymbolBinder& b, NcclApi* api) {
  b.bind(kNcclVersionSymbol, &api->getVersion);
  b.bind("ncclGetErrorString", &api->getErrorString);
  b.bind("ncclGetUniqueId", &api->getUniqueId);
  b.bind("ncclCommInitRank", &api->commInitRank);
  b.bindOptional("ncclCommInitRankConfig", &api->commInitRankConfig);  // 2.14+
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
  b.bind(kCudaRuntimeVersionSymbol, &api->runtimeGetVersion);
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
  b.bind("cudaStreamIsCapturing", &api->streamIsCapturing);
  b.bindOptional("cudaIpcGetMemHandle", &api->ipcGetMemHandle);
  b.bindOptional("cudaIpcOpenMemHandle", &api->ipcOpenMemHandle);
  b.bindOptional("cudaIpcCloseMemHandle", &api->ipcCloseMemHandle);
  b.bindOptional("cudaIpcGetEventHandle", &api->ipcGetEventHandle);
  b.bindOptional("cudaIpcOpenEventHandle", &api->ipcOpenEventHandle);
  b.bindOptional("cudaMallocAsync", &api->mallocAsync);
  b.bindOptional("cudaFreeAsync", &api->freeAsync);
}

DynamicLibrary<NcclApi>& nccl() {
  static DynamicLibrary<NcclApi> library(
      {"NCCL", "NCCL", kNcclVersionSymbol, kMinNcclVersion, &ncclVersionText, nullptr, nullptr,
       "CUDA tensors need NCCL 2.10 or newer: pip install \"hvd-magic[gpu]\" (the "
       "nvidia-nccl-cu12 wheel), or install a PyTorch build with CUDA, or set "
       "HVD_NCCL_LIBRARY to the path of a libnccl.so.2."},
      &bindNccl);
  return library;
}

DynamicLibrary<CudaApi>& cudaRuntime() {
  static DynamicLibrary<CudaApi> library(
      {"the CUDA runtime", "CUDA runtime", kCudaRuntimeVersionSymbol, kMinCudaRuntimeVersion,
       &cudaVersionText, nullptr, nullptr,
       "CUDA tensors need the CUDA runtime 11.0 or newer: pip install "
       "nvidia-cuda-runtime-cu12, or install a PyTorch build with CUDA, or set "
       "HVD_CUDA_RUNTIME_LIBRARY to the path of a libcudart.so."},
      &bindCuda);
  return library;
}

}  // namespace

LoadResult loadNccl(const std::vector<std::string>& candidates) {
  return nccl().load(candidates);
}

LoadResult loadCudaRuntime(const std::vector<std::string>& candidates) {
  return cudaRuntime().load(candidates);
}

LoadResult ncclLoadState() { return nccl().lastResult(); }
LoadResult cudaRuntimeLoadState() { return cudaRuntime().lastResult(); }

const NcclApi* ncclApi() { return nccl().api(); }
const CudaApi* cudaApi() { return cudaRuntime().api(); }

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
