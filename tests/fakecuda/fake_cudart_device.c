/* fake_cudart_device.c: the fake CUDA runtime's devices, versions, error strings, memory
 * registries and per-API call counters. Devices come from the environment, read once per
 * process: FAKE_CUDA_DEVICE_COUNT (default 1) and FAKE_CUDA_BUS_IDS (comma-separated PCI bus
 * ids, entry d for device d; default "0000:0<d+1>:00.0"). The current device is per thread,
 * as in CUDA. Memory is host memory, 256-byte aligned, tracked so leaks show in tests; device
 * memory is mapped from a memfd so that a peer process can open it (fake_cudart_ipc.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_cudart.h"

#define CUDA_VERSION_CODE 12040  /* 12.4: cudaRuntimeGetVersion and cudaDriverGetVersion */
#define ALIGNMENT 256
#define MAX_BUS_ID 32

/* ---- call counters ------------------------------------------------------------------------ */

static long call_counts[FC_API_COUNT];
static const char* const call_names[FC_API_COUNT] = {
#define FC_NAME(name) #name,
    FC_COUNTED_APIS(FC_NAME)
#undef FC_NAME
};

void fc_count(enum fc_api api) { __atomic_fetch_add(&call_counts[api], 1, __ATOMIC_RELAXED); }

/* Calls of the named API so far in this process; -1 for a name that is not counted. */
FC_API long fakeCudaCalls(const char* api_name) {
  for (int i = 0; api_name != NULL && i < FC_API_COUNT; ++i) {
    if (strcmp(api_name, call_names[i]) == 0) {
      return __atomic_load_n(&call_counts[i], __ATOMIC_RELAXED);
    }
  }
  return -1;
}

/* ---- devices and versions ------------------------------------------------------------------ */

static pthread_once_t devices_once = PTHREAD_ONCE_INIT;
static int device_count = 1;
static const char* bus_id_list = "";  /* FAKE_CUDA_BUS_IDS as read at first use */
static __thread int current_device = 0;

static void readDevices(void) {
  const char* count = getenv("FAKE_CUDA_DEVICE_COUNT");
  if (count != NULL && count[0] != '\0') device_count = atoi(count) > 0 ? atoi(count) : 0;
  const char* ids = getenv("FAKE_CUDA_BUS_IDS");
  if (ids != NULL) bus_id_list = strdup(ids);  /* kept for the life of the process */
  if (bus_id_list == NULL) bus_id_list = "";
}

static int devices(void) {
  pthread_once(&devices_once, readDevices);
  return device_count;
}

/* Entry `device` of FAKE_CUDA_BUS_IDS, or the default id, into out[MAX_BUS_ID]. */
static void busIdOf(int device, char* out) {
  const char* entry = bus_id_list;
  for (int i = 0; i < device && entry != NULL; ++i) {
    entry = strchr(entry, ',');
    if (entry != NULL) entry++;
  }
  const size_t length = entry != NULL ? strcspn(entry, ",") : 0;
  if (length > 0 && length < MAX_BUS_ID) {
    memcpy(out, entry, length);
    out[length] = '\0';
  } else {
    snprintf(out, MAX_BUS_ID, "0000:%02x:00.0", (unsigned)(device + 1) & 0xffu);
  }
}

FC_API int cudaRuntimeGetVersion(int* version) {
  fc_count(FC_CALL_cudaRuntimeGetVersion);
  if (version == NULL) return kCudaErrorInvalidValue;
  *version = CUDA_VERSION_CODE;
  return kCudaSuccess;
}

FC_API int cudaDriverGetVersion(int* version) {
  fc_count(FC_CALL_cudaDriverGetVersion);
  if (version == NULL) return kCudaErrorInvalidValue;
  *version = CUDA_VERSION_CODE;
  return kCudaSuccess;
}

FC_API int cudaGetDeviceCount(int* count) {
  fc_count(FC_CALL_cudaGetDeviceCount);
  if (count == NULL) return kCudaErrorInvalidValue;
  *count = devices();
  return *count > 0 ? kCudaSuccess : kCudaErrorNoDevice;
}

int fc_current_device(void) { return current_device; }

FC_API int cudaGetDevice(int* device) {
  fc_count(FC_CALL_cudaGetDevice);
  if (device == NULL) return kCudaErrorInvalidValue;
  if (devices() == 0) return kCudaErrorNoDevice;
  *device = current_device;
  return kCudaSuccess;
}

FC_API int cudaSetDevice(int device) {
  fc_count(FC_CALL_cudaSetDevice);
  if (device < 0 || device >= devices()) return kCudaErrorInvalidDevice;
  current_device = device;
  return kCudaSuccess;
}

/* Like CUDA, a short buffer gets a truncated (still terminated) id. */
FC_API int cudaDeviceGetPCIBusId(char* bus_id, int length, int device) {
  fc_count(FC_CALL_cudaDeviceGetPCIBusId);
  if (bus_id == NULL || length <= 0) return kCudaErrorInvalidValue;
  if (device < 0 || device >= devices()) return kCudaErrorInvalidDevice;
  char id[MAX_BUS_ID];
  busIdOf(device, id);
  snprintf(bus_id, (size_t)length, "%s", id);
  return kCudaSuccess;
}

FC_API const char* cudaGetErrorString(int error) {
  switch (error) {
    case kCudaSuccess: return "no error";
    case kCudaErrorInvalidValue: return "invalid argument";
    case kCudaErrorMemoryAllocation: return "out of memory";
    case kCudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case kCudaErrorNoDevice: return "no CUDA-capable device is detected";
    case kCudaErrorInvalidDevice: return "invalid device ordinal";
    case kCudaErrorInvalidResourceHandle: return "invalid resource handle";
    case kCudaErrorDeviceUninitialized: return "invalid device context";
    case kCudaErrorMapBufferObjectFailed: return "mapping of buffer object failed";
    case kCudaErrorNotReady: return "device not ready";
    case kCudaErrorNotSupported: return "operation not supported";
    case kCudaErrorStreamCaptureImplicit:
      return "operation would make the legacy stream depend on a capturing blocking stream";
    default: return "unrecognized error code";
  }
}

/* ---- memory -------------------------------------------------------------------------------- */

typedef struct fc_block fc_block;
struct fc_block {
  fc_block* next;
  void* ptr;
  size_t offset; /* FAKE_CUDA_SUBALLOC: the pointer given out is ptr + offset */
  size_t bytes;
  int fd;  /* device memory: the memfd it is mapped from (Note [IPC memory]); host: -1 */
};

typedef struct {
  pthread_mutex_t mu;
  fc_block* blocks;
  long live;
  size_t live_bytes;
  int shareable;  /* device memory: memfd-backed, so a peer process can map it */
} fc_registry;

static fc_registry device_memory = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 1};
static fc_registry host_memory = {PTHREAD_MUTEX_INITIALIZER, NULL, 0, 0, 0};

/* FAKE_CUDA_DEVICE_BYTES=N: device memory runs out past N live bytes (0 or unset: never), so
 * tests can see what a caller does when an allocation fails for lack of memory. */
static int outOfMemory(fc_registry* registry, size_t bytes) {
  const char* limit = registry->shareable ? getenv("FAKE_CUDA_DEVICE_BYTES") : NULL;
  const size_t cap = limit != NULL ? (size_t)strtoull(limit, NULL, 10) : 0;
  return cap != 0 && registry->live_bytes + bytes > cap;
}

/* Zero bytes gives NULL and success, as cudaMalloc(0) does. */
static int allocate(fc_registry* registry, void** pointer, size_t bytes) {
  if (pointer == NULL) return kCudaErrorInvalidValue;
  *pointer = NULL;
  if (bytes == 0) return kCudaSuccess;
  fc_block* block = calloc(1, sizeof(*block));
  if (block == NULL) return kCudaErrorMemoryAllocation;
  /* Note [fake sub-allocation]: FAKE_CUDA_SUBALLOC=N gives out device memory N bytes inside
   * a larger block, as CUDA's caching allocators do: an IPC handle and cuMemGetAddressRange
   * then name the block, whose base is not the pointer the caller got. */
  const char* sub = registry->shareable ? getenv("FAKE_CUDA_SUBALLOC") : NULL;
  block->offset = sub != NULL ? (size_t)strtoul(sub, NULL, 10) : 0;
  bytes += block->offset;
  block->bytes = bytes;
  block->fd = -1;
  pthread_mutex_lock(&registry->mu);
  const int refused = outOfMemory(registry, bytes);
  if (!refused) registry->live_bytes += bytes;  /* reserved before mapping */
  pthread_mutex_unlock(&registry->mu);
  if (refused) {
    free(block);
    return kCudaErrorMemoryAllocation;
  }
  if (registry->shareable) {
    block->ptr = fc_shared_map(bytes, &block->fd);
  } else if (posix_memalign(&block->ptr, ALIGNMENT, bytes) != 0) {
    block->ptr = NULL;
  }
  pthread_mutex_lock(&registry->mu);
  if (block->ptr != NULL) {
    block->next = registry->blocks;
    registry->blocks = block;
    registry->live++;
  } else {
    registry->live_bytes -= bytes;
  }
  pthread_mutex_unlock(&registry->mu);
  if (block->ptr == NULL) {
    free(block);
    return kCudaErrorMemoryAllocation;
  }
  *pointer = (char*)block->ptr + block->offset;
  return kCudaSuccess;
}

/* The registry's block given out as `pointer`, taken out of the registry (NULL if none). */
static fc_block* unregister(fc_registry* registry, void* pointer) {
  pthread_mutex_lock(&registry->mu);
  fc_block** p = &registry->blocks;
  while (*p != NULL && (char*)(*p)->ptr + (*p)->offset != (char*)pointer) p = &(*p)->next;
  fc_block* found = *p;
  if (found != NULL) {
    *p = found->next;
    registry->live--;
    registry->live_bytes -= found->bytes;
  }
  pthread_mutex_unlock(&registry->mu);
  return found;
}

static void unmap(fc_registry* registry, fc_block* found) {
  if (found->fd >= 0) {
    if (registry == &device_memory) fc_note_free_of_shared(found->fd);
    fc_shared_unmap(found->ptr, found->bytes, found->fd);
  } else {
    free(found->ptr);
  }
  free(found);
}

/* Like CUDA, waits for every stream first (queued work may still use the memory). */
static int release(fc_registry* registry, void* pointer) {
  fc_drain_all();
  if (pointer == NULL) return kCudaSuccess;
  fc_block* found = unregister(registry, pointer);
  if (found == NULL) return kCudaErrorInvalidValue;
  unmap(registry, found);
  return kCudaSuccess;
}

int fc_device_allocation(const void* pointer, void** base, size_t* bytes, int* fd) {
  int found = 0;
  pthread_mutex_lock(&device_memory.mu);
  for (fc_block* b = device_memory.blocks; b != NULL && !found; b = b->next) {
    const char* start = b->ptr;
    if ((const char*)pointer >= start && (const char*)pointer < start + b->bytes) {
      *base = b->ptr;
      *bytes = b->bytes;
      *fd = b->fd;
      found = 1;
    }
  }
  pthread_mutex_unlock(&device_memory.mu);
  return found;
}

/* cuMemGetAddressRange for the fake driver: the whole block holding `pointer`, this process's
 * own or a peer's it opened by IPC (CUDA answers for both). */
FC_API int fakeCudaAllocationRange(const void* pointer, void** base, size_t* bytes) {
  int fd = -1;
  if (fc_device_allocation(pointer, base, bytes, &fd)) return kCudaSuccess;
  return fc_ipc_mapping_range(pointer, base, bytes) ? kCudaSuccess : kCudaErrorInvalidValue;
}

static long live(fc_registry* registry) {
  pthread_mutex_lock(&registry->mu);
  const long n = registry->live;
  pthread_mutex_unlock(&registry->mu);
  return n;
}

FC_API int cudaMalloc(void** pointer, size_t bytes) {
  fc_count(FC_CALL_cudaMalloc);
  return allocate(&device_memory, pointer, bytes);
}

FC_API int cudaFree(void* pointer) {
  fc_count(FC_CALL_cudaFree);
  return release(&device_memory, pointer);
}

/* ---- the stream-ordered allocator (cudaMallocAsync, CUDA 11.2) ---------------------------- */

/* Note [Ordered frees read as poison]: cudaFreeAsync frees when its stream reaches the free;
 * the fake then maps fresh pages filled with 0xDB over the block (never reused: the range is
 * kept) instead of unmapping it, so work misordered after the free reads poison a test sees
 * instead of crashing the process. FAKE_CUDA_NO_MEMPOOL=1 makes cudaMallocAsync answer
 * cudaErrorNotSupported, as CUDA does on a device without memory pools. */
#define POISON 0xDB

static void runOrderedFree(fc_op* op) {
  fc_block* block = op->arg;
  if (block->fd >= 0) {
    fc_note_free_of_shared(block->fd);
    void* kept = mmap(block->ptr, block->bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    if (kept != MAP_FAILED) memset(kept, POISON, block->bytes);
    close(block->fd);
  }
  free(block);
}

FC_API int cudaMallocAsync(void** pointer, size_t bytes, void* stream) {
  fc_count(FC_CALL_cudaMallocAsync);
  const char* no_pool = getenv("FAKE_CUDA_NO_MEMPOOL");
  if (no_pool != NULL && strcmp(no_pool, "1") == 0) return kCudaErrorNotSupported;
  pthread_mutex_lock(&fc_mu);
  const int known = fc_check_stream_locked(stream);
  pthread_mutex_unlock(&fc_mu);
  if (known != kCudaSuccess) return known;
  return allocate(&device_memory, pointer, bytes);
}

FC_API int cudaFreeAsync(void* pointer, void* stream) {
  fc_count(FC_CALL_cudaFreeAsync);
  if (pointer == NULL) return kCudaSuccess;
  fc_block* found = unregister(&device_memory, pointer);
  if (found == NULL) return kCudaErrorInvalidValue;
  fc_op* op = fc_op_new(runOrderedFree);
  if (op != NULL) op->arg = found;
  const int queued = fc_enqueue(stream, op);
  if (queued != kCudaSuccess) unmap(&device_memory, found);  /* not queued: nothing uses it */
  return queued;
}

FC_API int cudaMallocHost(void** pointer, size_t bytes) {
  fc_count(FC_CALL_cudaMallocHost);
  return allocate(&host_memory, pointer, bytes);
}

FC_API int cudaFreeHost(void* pointer) {
  fc_count(FC_CALL_cudaFreeHost);
  return release(&host_memory, pointer);
}

FC_API long fakeCudaLiveAllocations(void) { return live(&device_memory); }
FC_API long fakeCudaLiveHostAllocations(void) { return live(&host_memory); }
