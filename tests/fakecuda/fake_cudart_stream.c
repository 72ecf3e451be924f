/* fake_cudart_stream.c: streams of the fake CUDA runtime. Each stream is a FIFO of ops run in
 * order by its own worker thread, so queued work is really asynchronous to the host. Owns the
 * stream list, the two built-in default streams, the copy/set/host-func ops, the delayed-fill
 * test kernel and every wait for a stream to drain. Locking: Note [One lock] in fake_cudart.h.
 *
 * Note [Default streams]: handle NULL (or 1, cudaStreamLegacy) is the legacy default stream:
 * one per process, created on first use. Like CUDA's, it synchronizes with every *blocking*
 * stream (created without cudaStreamNonBlocking, and the per-thread streams): work queued on it
 * waits for everything queued before on those streams, and work queued on them waits for what
 * is queued before on it. Handle 2 (cudaStreamPerThread) is a blocking stream of the calling
 * host thread, created on first use and drained and freed when that thread exits.
 * Non-blocking streams never wait implicitly.
 *
 * Note [Parked streams]: a stream is parked while its worker sleeps, waiting for work or, inside
 * an op, for something else to happen (a blocker's release, an event, a peer). Queuing work
 * unparks it at once. Tests that check that held work stays held wait for
 * fakeCudaStreamParked() instead of sleeping a while: once the stream is parked, the work it
 * could run has run. (A worker just woken by a release still reads as parked until it runs:
 * so the checks are only that held work is still held, never that released work is done.) */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "fake_cudart.h"

#define LEGACY_STREAM_HANDLE ((void*)1)
#define PER_THREAD_STREAM_HANDLE ((void*)2)
#define NON_BLOCKING_FLAG 0x1u

pthread_mutex_t fc_mu = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t fc_done_cv = PTHREAD_COND_INITIALIZER;

typedef struct fc_stream fc_stream;
struct fc_stream {
  fc_stream* next;             /* in `streams`, the list of every live stream */
  unsigned long id;            /* unique: an address may be reused after a destroy */
  pthread_t worker;
  pthread_cond_t work_cv;      /* the worker sleeps here while the queue is empty */
  fc_op *head, *tail;
  unsigned long enqueued;      /* ops ever queued / ever completed: FIFO, so a drain is */
  unsigned long completed;     /* "completed reaches the enqueued count seen at the start" */
  int waiters;                 /* host threads waiting for it to drain (destroy waits for 0) */
  int blocking;
  int user;                    /* made by cudaStreamCreateWithFlags */
  int device;                  /* a user stream's device (its creator's current device) */
  int stopping;
  int parked;                  /* Note [Parked streams]; atomic: ops park without fc_mu */
  int capture;                 /* Note [Fake capture] */
};

enum { kRunning = 0, kIdle = 1, kInOp = 2 };  /* values of fc_stream.parked */

static __thread fc_stream* this_worker;  /* the stream whose worker this thread is */

static void park(int state) {
  if (this_worker != NULL) __atomic_store_n(&this_worker->parked, state, __ATOMIC_SEQ_CST);
}

FC_API void fakeCudaWorkerParks(int parked) { park(parked ? kInOp : kRunning); }

static fc_stream* streams;
static unsigned long next_stream_id = 1;
static fc_stream* legacy_stream;
static pthread_key_t per_thread_key;
static pthread_once_t per_thread_once = PTHREAD_ONCE_INIT;

fc_op* fc_op_new(void (*run)(fc_op*)) {
  fc_op* op = calloc(1, sizeof(*op));
  if (op != NULL) op->run = run;
  return op;
}

static void* workerMain(void* arg) {
  fc_stream* s = arg;
  this_worker = s;
  pthread_mutex_lock(&fc_mu);
  for (;;) {
    while (s->head == NULL && !s->stopping) {
      park(kIdle);
      pthread_cond_wait(&s->work_cv, &fc_mu);
      park(kRunning);
    }
    fc_op* op = s->head;
    if (op == NULL) break;  /* stopping, and everything queued has run */
    s->head = op->next;
    if (s->head == NULL) s->tail = NULL;
    pthread_mutex_unlock(&fc_mu);
    op->run(op);
    free(op);
    pthread_mutex_lock(&fc_mu);
    s->completed++;
    pthread_cond_broadcast(&fc_done_cv);
  }
  pthread_mutex_unlock(&fc_mu);
  return NULL;
}

static fc_stream* streamNewLocked(int blocking, int user) {
  fc_stream* s = calloc(1, sizeof(*s));
  if (s == NULL) return NULL;
  s->id = next_stream_id++;
  s->blocking = blocking;
  s->user = user;
  s->device = fc_current_device();
  pthread_cond_init(&s->work_cv, NULL);
  if (pthread_create(&s->worker, NULL, workerMain, s) != 0) {
    pthread_cond_destroy(&s->work_cv);
    free(s);
    return NULL;
  }
  s->next = streams;
  streams = s;
  return s;
}

/* Host-side wait for what `s` had queued at the call. Needs fc_mu. */
static void drainLocked(fc_stream* s) {
  const unsigned long target = s->enqueued;
  s->waiters++;
  while (s->completed < target) pthread_cond_wait(&fc_done_cv, &fc_mu);
  s->waiters--;
  pthread_cond_broadcast(&fc_done_cv);  /* a destroy may be waiting for waiters == 0 */
}

/* Unlinks `s`, lets its worker run what is queued, then frees it. Called without fc_mu. */
static void streamStopAndFree(fc_stream* s) {
  pthread_mutex_lock(&fc_mu);
  for (fc_stream** p = &streams; *p != NULL; p = &(*p)->next) {
    if (*p == s) {
      *p = s->next;
      break;
    }
  }
  s->stopping = 1;
  pthread_cond_signal(&s->work_cv);
  pthread_mutex_unlock(&fc_mu);
  pthread_join(s->worker, NULL);
  pthread_mutex_lock(&fc_mu);
  while (s->waiters > 0) pthread_cond_wait(&fc_done_cv, &fc_mu);
  pthread_mutex_unlock(&fc_mu);
  pthread_cond_destroy(&s->work_cv);
  free(s);
}

static void perThreadExit(void* stream) { streamStopAndFree(stream); }
static void perThreadKeyInit(void) { pthread_key_create(&per_thread_key, perThreadExit); }

/* The stream a handle names, creating the built-in ones on first use; NULL if unknown. */
static fc_stream* resolveLocked(void* handle) {
  if (handle == NULL || handle == LEGACY_STREAM_HANDLE) {
    if (legacy_stream == NULL) legacy_stream = streamNewLocked(1, 0);
    return legacy_stream;
  }
  if (handle == PER_THREAD_STREAM_HANDLE) {
    pthread_once(&per_thread_once, perThreadKeyInit);
    fc_stream* s = pthread_getspecific(per_thread_key);
    if (s == NULL && (s = streamNewLocked(1, 0)) != NULL) pthread_setspecific(per_thread_key, s);
    return s;
  }
  for (fc_stream* s = streams; s != NULL; s = s->next) {
    if (s == handle && s->user) return s;
  }
  return NULL;
}

int fc_check_stream_locked(void* handle) {
  return resolveLocked(handle) != NULL ? kCudaSuccess : kCudaErrorInvalidResourceHandle;
}

int fc_stream_device_locked(void* handle) {
  fc_stream* s = resolveLocked(handle);
  return s != NULL && s->user ? s->device : fc_current_device();
}

static void pushLocked(fc_stream* s, fc_op* op) {
  op->next = NULL;
  if (s->tail != NULL) {
    s->tail->next = op;
  } else {
    s->head = op;
  }
  s->tail = op;
  s->enqueued++;
  int idle = kIdle;  /* an idle worker has work again; one inside an op still waits there */
  __atomic_compare_exchange_n(&s->parked, &idle, kRunning, 0, __ATOMIC_SEQ_CST,
                              __ATOMIC_SEQ_CST);
  pthread_cond_signal(&s->work_cv);
}

/* `waiter` waits (on its worker) for everything queued on `target` so far. */
static void orderAfterLocked(fc_stream* waiter, fc_stream* target) {
  if (target == NULL || target == waiter || target->completed == target->enqueued) return;
  fc_marker* marker = fc_marker_new_locked(2);
  fc_op* record = fc_record_op(marker);
  fc_op* wait = fc_wait_op(marker);
  if (marker == NULL || record == NULL || wait == NULL) abort();  /* out of memory in a test */
  pushLocked(target, record);
  pushLocked(waiter, wait);
}

int fc_enqueue_locked(void* handle, fc_op* op) {
  fc_stream* s = op != NULL ? resolveLocked(handle) : NULL;
  if (s == NULL) {
    free(op);
    return op == NULL ? kCudaErrorMemoryAllocation : kCudaErrorInvalidResourceHandle;
  }
  if (s == legacy_stream) {  /* Note [Default streams] */
    for (fc_stream* other = streams; other != NULL; other = other->next) {
      if (other->blocking) orderAfterLocked(s, other);
    }
  } else if (s->blocking) {
    orderAfterLocked(s, legacy_stream);
  }
  pushLocked(s, op);
  return kCudaSuccess;
}

int fc_enqueue(void* handle, fc_op* op) {
  pthread_mutex_lock(&fc_mu);
  const int result = fc_enqueue_locked(handle, op);
  pthread_mutex_unlock(&fc_mu);
  return result;
}

/* Waits for every stream, each to what it had queued at the call. The list may change while
 * fc_mu is released, so each stream is looked up again (by id) before its wait. */
void fc_drain_all(void) {
  pthread_mutex_lock(&fc_mu);
  size_t n = 0;
  for (fc_stream* s = streams; s != NULL; s = s->next) n++;
  unsigned long* ids = calloc(2 * n + 1, sizeof(*ids));  /* id, target pairs */
  if (ids == NULL) abort();
  n = 0;
  for (fc_stream* s = streams; s != NULL; s = s->next, n++) {
    ids[2 * n] = s->id;
    ids[2 * n + 1] = s->enqueued;
  }
  for (size_t i = 0; i < n; ++i) {
    fc_stream* s = streams;
    while (s != NULL && s->id != ids[2 * i]) s = s->next;
    if (s == NULL) continue;  /* destroyed meanwhile, which drained it */
    s->waiters++;
    while (s->completed < ids[2 * i + 1]) {
      fakeCudaWorkerParks(1);  /* a no-op on a host thread (cudaDeviceSynchronize) */
      pthread_cond_wait(&fc_done_cv, &fc_mu);
      fakeCudaWorkerParks(0);
    }
    s->waiters--;
    pthread_cond_broadcast(&fc_done_cv);
  }
  pthread_mutex_unlock(&fc_mu);
  free(ids);
}

FC_API int cudaStreamCreateWithFlags(void** stream, unsigned flags) {
  fc_count(FC_CALL_cudaStreamCreateWithFlags);
  if (stream == NULL || (flags & ~NON_BLOCKING_FLAG) != 0) return kCudaErrorInvalidValue;
  pthread_mutex_lock(&fc_mu);
  fc_stream* s = streamNewLocked((flags & NON_BLOCKING_FLAG) == 0, 1);
  pthread_mutex_unlock(&fc_mu);
  if (s == NULL) return kCudaErrorMemoryAllocation;
  *stream = s;
  return kCudaSuccess;
}

/* Note [Fake capture]: cudaStreamIsCapturing answers what fakeCudaSetCapture last set for the
 * stream (0 none, 1 active, 2 invalidated); the legacy stream, while another stream captures,
 * answers cudaErrorStreamCaptureImplicit, as CUDA's global capture mode does. Nothing is
 * actually captured: ops still run. */
FC_API int fakeCudaSetCapture(void* stream, int status) {
  pthread_mutex_lock(&fc_mu);
  fc_stream* s = resolveLocked(stream);
  if (s != NULL) s->capture = status;
  pthread_mutex_unlock(&fc_mu);
  return s != NULL ? kCudaSuccess : kCudaErrorInvalidResourceHandle;
}

FC_API int cudaStreamIsCapturing(void* stream, int* status) {
  fc_count(FC_CALL_cudaStreamIsCapturing);
  if (status == NULL) return kCudaErrorInvalidValue;
  pthread_mutex_lock(&fc_mu);
  fc_stream* s = resolveLocked(stream);
  int rc = s != NULL ? kCudaSuccess : kCudaErrorInvalidResourceHandle;
  if (s != NULL) *status = s->capture;
  if (s != NULL && s == legacy_stream) {
    for (fc_stream* other = streams; other != NULL; other = other->next) {
      if (other != s && other->capture != 0) rc = kCudaErrorStreamCaptureImplicit;
    }
  }
  pthread_mutex_unlock(&fc_mu);
  return rc;
}

FC_API int cudaStreamDestroy(void* stream) {
  fc_count(FC_CALL_cudaStreamDestroy);
  pthread_mutex_lock(&fc_mu);
  fc_stream* s = stream != NULL && stream != LEGACY_STREAM_HANDLE &&
                         stream != PER_THREAD_STREAM_HANDLE
                     ? resolveLocked(stream)
                     : NULL;
  pthread_mutex_unlock(&fc_mu);
  if (s == NULL) return kCudaErrorInvalidResourceHandle;
  streamStopAndFree(s);  /* runs what is queued first, as CUDA does before releasing it */
  return kCudaSuccess;
}

FC_API int cudaStreamSynchronize(void* stream) {
  fc_count(FC_CALL_cudaStreamSynchronize);
  pthread_mutex_lock(&fc_mu);
  fc_stream* s = resolveLocked(stream);
  if (s != NULL) drainLocked(s);
  pthread_mutex_unlock(&fc_mu);
  return s != NULL ? kCudaSuccess : kCudaErrorInvalidResourceHandle;
}

FC_API int cudaDeviceSynchronize(void) {
  fc_count(FC_CALL_cudaDeviceSynchronize);
  fc_drain_all();
  return kCudaSuccess;
}

static void runCopy(fc_op* op) { memmove(op->dst, op->src, op->bytes); }
static void runSet(fc_op* op) { memset(op->dst, op->value, op->bytes); }
static void runHostFunc(fc_op* op) { op->fn(op->arg); }

static void runDelayedFill(fc_op* op) {
  struct timespec left = {op->delay_ms / 1000, (long)(op->delay_ms % 1000) * 1000000L};
  while (nanosleep(&left, &left) != 0 && errno == EINTR) {
  }
  memset(op->dst, op->value, op->bytes);
}

/* kind: 0..3 as named, 4 (cudaMemcpyDefault) inferred; every pointer is a host pointer. */
FC_API int cudaMemcpyAsync(void* dst, const void* src, size_t bytes, int kind, void* stream) {
  fc_count(FC_CALL_cudaMemcpyAsync);
  if (kind < 0 || kind > 4) return kCudaErrorInvalidMemcpyDirection;
  if (bytes > 0 && (dst == NULL || src == NULL)) return kCudaErrorInvalidValue;
  fc_op* op = fc_op_new(runCopy);
  if (op != NULL) {
    op->dst = dst;
    op->src = src;
    op->bytes = bytes;
  }
  return fc_enqueue(stream, op);
}

FC_API int cudaMemsetAsync(void* dst, int value, size_t bytes, void* stream) {
  fc_count(FC_CALL_cudaMemsetAsync);
  if (bytes > 0 && dst == NULL) return kCudaErrorInvalidValue;
  fc_op* op = fc_op_new(runSet);
  if (op != NULL) {
    op->dst = dst;
    op->value = value;
    op->bytes = bytes;
  }
  return fc_enqueue(stream, op);
}

/* `fn` runs on the stream's worker; like CUDA, it must not call CUDA APIs that wait. */
FC_API int cudaLaunchHostFunc(void* stream, void (*fn)(void*), void* user_data) {
  fc_count(FC_CALL_cudaLaunchHostFunc);
  if (fn == NULL) return kCudaErrorInvalidValue;
  fc_op* op = fc_op_new(runHostFunc);
  if (op != NULL) {
    op->fn = fn;
    op->arg = user_data;
  }
  return fc_enqueue(stream, op);
}

/* Test kernel: sleeps delay_ms on the stream's worker, then sets `bytes` bytes to `byte`. */
FC_API int fakeCudaLaunchDelayedFill(void* dst, int byte, size_t bytes, int delay_ms,
                                     void* stream) {
  if ((bytes > 0 && dst == NULL) || delay_ms < 0) return kCudaErrorInvalidValue;
  fc_op* op = fc_op_new(runDelayedFill);
  if (op != NULL) {
    op->dst = dst;
    op->value = byte;
    op->bytes = bytes;
    op->delay_ms = delay_ms;
  }
  return fc_enqueue(stream, op);
}

/* 1 while the stream's worker sleeps (Note [Parked streams]), 0 while it runs, or minus a
 * cudaError_t for an unknown handle. */
FC_API long fakeCudaStreamParked(void* stream) {
  pthread_mutex_lock(&fc_mu);
  fc_stream* s = resolveLocked(stream);
  const long parked = s == NULL ? -kCudaErrorInvalidResourceHandle
                                : __atomic_load_n(&s->parked, __ATOMIC_SEQ_CST) != kRunning;
  pthread_mutex_unlock(&fc_mu);
  return parked;
}

FC_API long fakeCudaLiveStreams(void) {
  long n = 0;
  pthread_mutex_lock(&fc_mu);
  for (fc_stream* s = streams; s != NULL; s = s->next) n += s->user;
  pthread_mutex_unlock(&fc_mu);
  return n;
}
