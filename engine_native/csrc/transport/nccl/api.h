// The slice of the NCCL and CUDA runtime C APIs this core calls, declared here as opaque handles
// and function-pointer types so that no CUDA or NCCL header is ever included (DESIGN §3
// "Boundary"). The loader (loader.h) fills NcclApi / CudaApi with dlsym; everything else calls
// through those tables. Any thread may read a published table; it never changes once published.
//
// Note [Stable C ABI]: every value below is part of the public, frozen C ABI of nccl.h (since
// NCCL 2.0; ncclAvg and ncclBfloat16 since 2.10) and cuda_runtime_api.h (CUDA 11-13). Enums
// are passed as int, as C does; ncclUniqueId is a 128-byte struct passed by value.
#pragma once

#include <cstddef>

namespace hvd::transport::nccl {

// ---- NCCL (nccl.h) ------------------------------------------------------------------------

struct NcclCommOpaque;                       // ncclComm
using NcclComm = NcclCommOpaque*;            // ncclComm_t
struct CudaStreamOpaque;                     // CUstream_st
using CudaStream = CudaStreamOpaque*;        // cudaStream_t (also a driver CUstream)
struct CudaEventOpaque;                      // CUevent_st
using CudaEvent = CudaEventOpaque*;          // cudaEvent_t

constexpr size_t kNcclUniqueIdBytes = 128;   // NCCL_UNIQUE_ID_BYTES
struct NcclUniqueId {
  char internal[kNcclUniqueIdBytes];
};

// ncclResult_t
constexpr int kNcclSuccess = 0;
constexpr int kNcclInProgress = 7;  // non-blocking communicators only (NCCL 2.14+)

// ncclDataType_t
enum NcclDataType : int {
  kNcclInt8 = 0, kNcclUint8 = 1, kNcclInt32 = 2, kNcclUint32 = 3, kNcclInt64 = 4,
  kNcclUint64 = 5, kNcclFloat16 = 6, kNcclFloat32 = 7, kNcclFloat64 = 8, kNcclBfloat16 = 9,
};

// ncclRedOp_t
enum NcclRedOp : int { kNcclSum = 0, kNcclProd = 1, kNcclMax = 2, kNcclMin = 3, kNcclAvg = 4 };

// NCCL 2.9+ encodes versions as major*10000 + minor*100 + patch (2.32.3 -> 23203); earlier ones
// as major*1000 + minor*100 + patch (2.8.4 -> 2804). ncclGetVersion returns that code, which is
// also what Horovod's nccl_built() returns.
constexpr int kMinNcclVersion = 21000;       // 2.10.0: ncclAvg and ncclBfloat16
constexpr char kNcclVersionSymbol[] = "ncclGetVersion";

using NcclGetVersionFn = int (*)(int* version);
using NcclGetErrorStringFn = const char* (*)(int result);
using NcclGetUniqueIdFn = int (*)(NcclUniqueId* id);
using NcclCommInitRankFn = int (*)(NcclComm* comm, int nranks, NcclUniqueId id, int rank);
// ncclConfig_t as nccl.h declares it since 2.18 (struct ncclConfig_v21700). NCCL reads `size`
// bytes of it and, by `version`, defaults the fields an older header did not have, so this
// layout works with every NCCL that has ncclCommInitRankConfig (2.14+). Fields past splitShare
// (2.25+) are not declared and keep NCCL's defaults.
constexpr unsigned kNcclConfigMagic = 0xcafebeef;
constexpr int kNcclConfigUndefInt = -2147483647 - 1;  // NCCL_CONFIG_UNDEF_INT (INT_MIN)
constexpr unsigned kNcclConfigVersion = 21700;        // the layout below
struct NcclConfig {  // = NCCL_CONFIG_INITIALIZER
  size_t size = sizeof(NcclConfig);
  unsigned magic = kNcclConfigMagic;
  unsigned version = kNcclConfigVersion;
  int blocking = kNcclConfigUndefInt;
  int cgaClusterSize = kNcclConfigUndefInt;
  int minCTAs = kNcclConfigUndefInt;
  int maxCTAs = kNcclConfigUndefInt;
  const char* netName = nullptr;
  int splitShare = kNcclConfigUndefInt;
};
static_assert(offsetof(NcclConfig, blocking) == 16 && offsetof(NcclConfig, netName) == 32 &&
                  sizeof(NcclConfig) == 48,
              "NcclConfig must match ncclConfig_t (LP64)");
using NcclCommInitRankConfigFn = int (*)(NcclComm* comm, int nranks, NcclUniqueId id, int rank,
                                         NcclConfig* config);
using NcclCommDestroyFn = int (*)(NcclComm comm);
using NcclCommAbortFn = int (*)(NcclComm comm);
using NcclCommGetAsyncErrorFn = int (*)(NcclComm comm, int* result);
using NcclAllReduceFn = int (*)(const void* send, void* recv, size_t count, int dtype, int op,
                                NcclComm comm, CudaStream stream);
using NcclBroadcastFn = int (*)(const void* send, void* recv, size_t count, int dtype, int root,
                                NcclComm comm, CudaStream stream);
using NcclAllGatherFn = int (*)(const void* send, void* recv, size_t send_count, int dtype,
                                NcclComm comm, CudaStream stream);
using NcclReduceScatterFn = int (*)(const void* send, void* recv, size_t recv_count, int dtype,
                                    int op, NcclComm comm, CudaStream stream);
using NcclSendFn = int (*)(const void* send, size_t count, int dtype, int peer, NcclComm comm,
                           CudaStream stream);
using NcclRecvFn = int (*)(void* recv, size_t count, int dtype, int peer, NcclComm comm,
                           CudaStream stream);
using NcclReduceFn = int (*)(const void* send, void* recv, size_t count, int dtype, int op,
                             int root, NcclComm comm, CudaStream stream);
using NcclGroupFn = int (*)();
// Optional (NCCL 2.11+): a sum that first multiplies every input by a scalar held on the host.
constexpr int kNcclScalarHostImmediate = 1;  // ncclScalarResidence_t
using NcclRedOpCreatePreMulSumFn = int (*)(int* op, void* scalar, int dtype, int residence,
                                           NcclComm comm);
using NcclRedOpDestroyFn = int (*)(int op, NcclComm comm);

struct NcclApi {
  NcclGetVersionFn getVersion = nullptr;
  NcclGetErrorStringFn getErrorString = nullptr;
  NcclGetUniqueIdFn getUniqueId = nullptr;
  NcclCommInitRankFn commInitRank = nullptr;
  // Optional (NCCL 2.14+): without it set-up blocks (Note [Non-blocking set-up]).
  NcclCommInitRankConfigFn commInitRankConfig = nullptr;
  NcclCommDestroyFn commDestroy = nullptr;
  NcclCommAbortFn commAbort = nullptr;
  NcclCommGetAsyncErrorFn commGetAsyncError = nullptr;
  NcclAllReduceFn allReduce = nullptr;
  NcclBroadcastFn broadcast = nullptr;
  NcclAllGatherFn allGather = nullptr;
  NcclReduceScatterFn reduceScatter = nullptr;
  NcclSendFn send = nullptr;
  NcclRecvFn recv = nullptr;
  NcclReduceFn reduce = nullptr;
  NcclGroupFn groupStart = nullptr;
  NcclGroupFn groupEnd = nullptr;
  NcclRedOpCreatePreMulSumFn redOpCreatePreMulSum = nullptr;  // optional: may stay nullptr
  NcclRedOpDestroyFn redOpDestroy = nullptr;                  // optional: may stay nullptr
};

// ---- CUDA runtime (cuda_runtime_api.h) ----------------------------------------------------

// cudaError_t
constexpr int kCudaSuccess = 0;
constexpr int kCudaErrorMemoryAllocation = 2;
constexpr int kCudaErrorNotReady = 600;
constexpr int kCudaErrorNotSupported = 801;  // e.g. cudaMallocAsync on a device without pools
constexpr int kCudaErrorStreamCaptureImplicit = 906;  // the legacy stream during a global capture
// cudaStreamCaptureStatus
constexpr int kCudaStreamCaptureStatusNone = 0;
// cudaMemcpyKind
constexpr int kCudaMemcpyDefault = 4;        // direction inferred (unified addressing)
// flags
constexpr unsigned kCudaStreamNonBlocking = 0x1;
constexpr unsigned kCudaEventDisableTiming = 0x2;

constexpr int kMinCudaRuntimeVersion = 11000;  // cudaRuntimeGetVersion: 1000*major + 10*minor
constexpr char kCudaRuntimeVersionSymbol[] = "cudaRuntimeGetVersion";

using CudaIntOutFn = int (*)(int* value);    // cudaRuntimeGetVersion, cudaGetDeviceCount, ...
using CudaGetErrorStringFn = const char* (*)(int error);
using CudaSetDeviceFn = int (*)(int device);
using CudaDeviceGetPciBusIdFn = int (*)(char* bus_id, int length, int device);
using CudaStreamCreateWithFlagsFn = int (*)(CudaStream* stream, unsigned flags);
using CudaStreamFn = int (*)(CudaStream stream);  // cudaStreamDestroy, cudaStreamSynchronize
using CudaStreamWaitEventFn = int (*)(CudaStream stream, CudaEvent event, unsigned flags);
using CudaEventCreateWithFlagsFn = int (*)(CudaEvent* event, unsigned flags);
using CudaEventRecordFn = int (*)(CudaEvent event, CudaStream stream);
using CudaEventFn = int (*)(CudaEvent event);      // Query, Destroy
using CudaMallocFn = int (*)(void** pointer, size_t bytes);  // cudaMalloc, cudaMallocHost
using CudaFreeFn = int (*)(void* pointer);                   // cudaFree, cudaFreeHost
using CudaMemcpyAsyncFn = int (*)(void* dst, const void* src, size_t bytes, int kind,
                                  CudaStream stream);
using CudaMemsetAsyncFn = int (*)(void* dst, int value, size_t bytes, CudaStream stream);
using CudaHostFn = void (*)(void* user_data);  // runs on a driver thread: no CUDA calls in it
using CudaLaunchHostFuncFn = int (*)(CudaStream stream, CudaHostFn fn, void* user_data);
using CudaStreamIsCapturingFn = int (*)(CudaStream stream, int* capture_status);
// CUDA IPC (ranks sharing one GPU): cudaIpcMemHandle_t and cudaIpcEventHandle_t are both 64
// opaque bytes passed by value (CUDA_IPC_HANDLE_SIZE).
constexpr unsigned kCudaEventInterprocess = 0x4;          // needs kCudaEventDisableTiming too
constexpr unsigned kCudaIpcMemLazyEnablePeerAccess = 0x1;
constexpr size_t kCudaIpcHandleBytes = 64;
struct CudaIpcHandle {
  char reserved[kCudaIpcHandleBytes];
};
using CudaIpcGetMemHandleFn = int (*)(CudaIpcHandle* handle, void* device_pointer);
using CudaIpcOpenMemHandleFn = int (*)(void** device_pointer, CudaIpcHandle handle,
                                       unsigned flags);
using CudaIpcCloseMemHandleFn = int (*)(void* device_pointer);
using CudaIpcGetEventHandleFn = int (*)(CudaIpcHandle* handle, CudaEvent event);
using CudaIpcOpenEventHandleFn = int (*)(CudaEvent* event, CudaIpcHandle handle);
// The stream-ordered allocator (CUDA 11.2): transport/nccl/ordered_memory.h.
using CudaMallocAsyncFn = int (*)(void** pointer, size_t bytes, CudaStream stream);
using CudaFreeAsyncFn = int (*)(void* pointer, CudaStream stream);

struct CudaApi {
  CudaIntOutFn runtimeGetVersion = nullptr;
  CudaIntOutFn driverGetVersion = nullptr;
  CudaIntOutFn getDeviceCount = nullptr;
  CudaIntOutFn getDevice = nullptr;
  CudaSetDeviceFn setDevice = nullptr;
  CudaGetErrorStringFn getErrorString = nullptr;
  CudaDeviceGetPciBusIdFn deviceGetPciBusId = nullptr;
  CudaStreamCreateWithFlagsFn streamCreateWithFlags = nullptr;
  CudaStreamFn streamDestroy = nullptr;
  CudaStreamFn streamSynchronize = nullptr;
  CudaStreamWaitEventFn streamWaitEvent = nullptr;
  CudaEventCreateWithFlagsFn eventCreateWithFlags = nullptr;
  CudaEventRecordFn eventRecord = nullptr;
  CudaEventFn eventQuery = nullptr;
  CudaEventFn eventDestroy = nullptr;
  CudaMallocFn malloc = nullptr;
  CudaFreeFn free = nullptr;
  CudaMallocFn mallocHost = nullptr;
  CudaFreeFn freeHost = nullptr;
  CudaMemcpyAsyncFn memcpyAsync = nullptr;
  CudaMemsetAsyncFn memsetAsync = nullptr;
  CudaLaunchHostFuncFn launchHostFunc = nullptr;
  CudaStreamIsCapturingFn streamIsCapturing = nullptr;
  // Optional (a partial runtime may lack them): without all five, ranks sharing a GPU stage.
  CudaIpcGetMemHandleFn ipcGetMemHandle = nullptr;
  CudaIpcOpenMemHandleFn ipcOpenMemHandle = nullptr;
  CudaIpcCloseMemHandleFn ipcCloseMemHandle = nullptr;
  CudaIpcGetEventHandleFn ipcGetEventHandle = nullptr;
  CudaIpcOpenEventHandleFn ipcOpenEventHandle = nullptr;
  // Optional (CUDA 11.2+): without both, device buffers come from cudaMalloc/cudaFree.
  CudaMallocAsyncFn mallocAsync = nullptr;
  CudaFreeAsyncFn freeAsync = nullptr;
  bool hasIpc() const {
    return ipcGetMemHandle != nullptr && ipcOpenMemHandle != nullptr &&
           ipcCloseMemHandle != nullptr && ipcGetEventHandle != nullptr &&
           ipcOpenEventHandle != nullptr;
  }
};

}  // namespace hvd::transport::nccl
