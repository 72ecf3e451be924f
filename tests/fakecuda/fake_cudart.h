/* fake_cudart.h: what the fake CUDA runtime's files (fake_cudart_*.c) share. "Device memory" is
 * host memory; a stream is a FIFO of ops run by its own worker thread (fake_cudart_stream.c);
 * events are markers in those FIFOs (fake_cudart_event.c); memory, devices, error strings and the
 * call counters live in fake_cudart_device.c. Only FC_API symbols are exported (build.py
 * compiles with -fvisibility=hidden). Test-only. */
#pragma once

#include <pthread.h>
#include <stddef.h>

#define FC_API __attribute__((visibility("default")))

/* cudaError_t values this fake returns (cudaGetErrorString knows each one). */
enum {
  kCudaSuccess = 0,
  kCudaErrorInvalidValue = 1,
  kCudaErrorMemoryAllocation = 2,
  kCudaErrorInvalidMemcpyDirection = 21,
  kCudaErrorNoDevice = 100,
  kCudaErrorInvalidDevice = 101,
  kCudaErrorDeviceUninitialized = 201,  /* "invalid device context": e.g. your own IPC handle */
  kCudaErrorMapBufferObjectFailed = 205,
  kCudaErrorInvalidResourceHandle = 400,
  kCudaErrorNotReady = 600,
  kCudaErrorNotSupported = 801,
  kCudaErrorStreamCaptureImplicit = 906,
};

/* Every API whose calls fakeCudaCalls(name) counts. */
#define FC_COUNTED_APIS(X)                                                                    \
  X(cudaRuntimeGetVersion) X(cudaDriverGetVersion) X(cudaGetDeviceCount) X(cudaGetDevice)     \
  X(cudaSetDevice) X(cudaDeviceGetPCIBusId) X(cudaDeviceSynchronize)                          \
  X(cudaStreamCreateWithFlags) X(cudaStreamDestroy) X(cudaStreamSynchronize)                  \
  X(cudaStreamWaitEvent) X(cudaEventCreateWithFlags) X(cudaEventRecord) X(cudaEventQuery)     \
  X(cudaEventSynchronize) X(cudaEventDestroy) X(cudaMalloc) X(cudaFree) X(cudaMallocHost)    \
  X(cudaFreeHost) X(cudaMemcpyAsync) X(cudaMemsetAsync) X(cudaLaunchHostFunc)                \
  X(cudaStreamIsCapturing) X(cudaMallocAsync) X(cudaFreeAsync)                              \
  X(cudaIpcGetMemHandle) X(cudaIpcOpenMemHandle) X(cudaIpcCloseMemHandle)                     \
  X(cudaIpcGetEventHandle) X(cudaIpcOpenEventHandle)

enum fc_api {
#define FC_ENUM(name) FC_CALL_##name,
  FC_COUNTED_APIS(FC_ENUM)
#undef FC_ENUM
  FC_API_COUNT
};

void fc_count(enum fc_api api);

/* Note [One lock]: fc_mu guards every stream queue, event and marker; fc_done_cv is broadcast
 * whenever an op completes, a marker fires or a blocker is released. Every host-side wait
 * (synchronize, cudaFree) and every device-side wait (wait-event ops) sleeps on it with its own
 * predicate. Ops themselves run without fc_mu. */
extern pthread_mutex_t fc_mu;
extern pthread_cond_t fc_done_cv;

/* One unit of work on a stream. run() is called on the stream's worker without fc_mu; the
 * worker frees the op afterwards. Fields are used as each kind needs. */
typedef struct fc_op fc_op;
struct fc_op {
  fc_op* next;
  void (*run)(fc_op* op);
  void* dst;
  const void* src;
  size_t bytes;
  int value;
  int delay_ms;
  void (*fn)(void*);
  void* arg;
  struct fc_marker* marker;
  struct fc_blocker* blocker;
};

fc_op* fc_op_new(void (*run)(fc_op*));
/* Queues `op` on the stream named by `handle` (NULL/1: legacy default, 2: per-thread default,
 * else one made by cudaStreamCreateWithFlags). Takes `op` in all cases: frees it on error.
 * The _locked form needs fc_mu held. */
int fc_enqueue(void* handle, fc_op* op);
int fc_enqueue_locked(void* handle, fc_op* op);
/* kCudaSuccess if `handle` names a stream (creating a built-in one on first use). */
int fc_check_stream_locked(void* handle);
/* The device a stream belongs to: a created one, its creator's current device then; the
 * built-in ones (legacy, per-thread), the calling thread's current device, as in CUDA. */
int fc_stream_device_locked(void* handle);
/* The calling thread's current device (cudaSetDevice). */
int fc_current_device(void);
/* Waits until every stream has run what was queued before the call (cudaDeviceSynchronize). */
void fc_drain_all(void);
/* Note [Parked streams] (fake_cudart_stream.c): an op about to sleep until something else
 * happens calls fakeCudaWorkerParks(1) first and fakeCudaWorkerParks(0) once awake. */
FC_API void fakeCudaWorkerParks(int parked);

/* Markers (fake_cudart_event.c): one per event record, fired when its stream reaches it. */
typedef struct fc_marker fc_marker;
fc_marker* fc_marker_new_locked(int refs);
fc_op* fc_record_op(fc_marker* marker);  /* fires the marker, drops one reference */
fc_op* fc_wait_op(fc_marker* marker);    /* blocks its stream until fired, drops one ref */

/* Device memory (fake_cudart_device.c): 1 and the allocation holding `pointer` (its base, size
 * and memfd), or 0 when `pointer` is not in device memory. */
int fc_device_allocation(const void* pointer, void** base, size_t* bytes, int* fd);
/* The same for a peer's allocation this process opened (fake_cudart_ipc.c): 1 when found. */
int fc_ipc_mapping_range(const void* pointer, void** base, size_t* bytes);
/* cudaFree of an exported allocation: counts it when a peer still maps it (fake_cudart_ipc.c). */
void fc_note_free_of_shared(int fd);

/* Note [IPC memory] (fake_cudart_ipc.c): device memory is a MAP_SHARED mapping of a memfd, so a
 * peer can map the same pages through /proc/<pid>/fd/<fd>. fc_shared_map returns the mapping
 * (NULL on failure) and its fd; fc_shared_unmap undoes both. */
void* fc_shared_map(size_t bytes, int* fd);
void fc_shared_unmap(void* pointer, size_t bytes, int fd);

/* Interprocess events (fake_cudart_ipc.c): an event made with cudaEventInterprocess, or opened
 * from a peer's handle, keeps its records in a shared page (Note [IPC events]). */
typedef struct fc_shared_event fc_shared_event;
fc_shared_event* fc_shared_event_new(void);        /* NULL on failure */
void fc_shared_event_free(fc_shared_event* shared);
int fc_shared_event_record_locked(fc_shared_event* shared, void* stream);
int fc_shared_event_wait_locked(fc_shared_event* shared, void* stream);
int fc_shared_event_done(const fc_shared_event* shared);
/* fake_cudart_event.c: the shared part of an event (NULL for an ordinary one), and a new event
 * around an opened one (takes `shared` on success). */
fc_shared_event* fc_event_shared_locked(void* event);
int fc_event_adopt(void** event, fc_shared_event* shared);
