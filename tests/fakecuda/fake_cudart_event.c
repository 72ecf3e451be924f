/* fake_cudart_event.c: events of the fake CUDA runtime, and the blocker test kernel.
 *
 * Note [Event records]: cudaEventRecord makes a fresh marker, queues an op that fires it, and
 * makes it the event's latest record; the event only ever reports on its latest record, as in
 * CUDA. cudaStreamWaitEvent captures the latest marker *at the call* (a reference held by the
 * queued wait op), so re-recording the event later changes nothing for that wait. Markers are
 * reference counted (event + queued ops + sleeping synchronizers), all under fc_mu. An
 * interprocess event records through its shared page instead (Note [IPC events] in
 * fake_cudart_ipc.c). */
#include <stdlib.h>
#include <time.h>

#include "fake_cudart.h"

struct fc_marker {
  int done;
  int refs;
};

typedef struct fc_event fc_event;
struct fc_event {
  fc_event* next;      /* in `events`, the list of live events */
  fc_marker* latest;   /* the latest record, NULL if never recorded */
  int device;          /* the creator's current device: it records only on that device */
  fc_shared_event* shared;  /* cudaEventInterprocess, or opened from a peer's handle */
};

#define EVENT_INTERPROCESS 0x4u
#define EVENT_DISABLE_TIMING 0x2u

/* A pending blocker; released ones leave the list, so a second release is an error. */
typedef struct fc_blocker fc_blocker;
struct fc_blocker {
  fc_blocker* next;
  long token;
  int released;
};

static fc_event* events;
static fc_blocker* blockers;
static long next_token = 1;

fc_marker* fc_marker_new_locked(int refs) {
  fc_marker* marker = calloc(1, sizeof(*marker));
  if (marker != NULL) marker->refs = refs;
  return marker;
}

static void markerReleaseLocked(fc_marker* marker) {
  if (marker != NULL && --marker->refs == 0) free(marker);
}

static void runRecord(fc_op* op) {
  pthread_mutex_lock(&fc_mu);
  op->marker->done = 1;
  markerReleaseLocked(op->marker);
  pthread_cond_broadcast(&fc_done_cv);
  pthread_mutex_unlock(&fc_mu);
}

static void runWait(fc_op* op) {
  pthread_mutex_lock(&fc_mu);
  while (!op->marker->done) {
    fakeCudaWorkerParks(1);
    pthread_cond_wait(&fc_done_cv, &fc_mu);
    fakeCudaWorkerParks(0);
  }
  markerReleaseLocked(op->marker);
  pthread_mutex_unlock(&fc_mu);
}

static fc_op* markerOp(fc_marker* marker, void (*run)(fc_op*)) {
  fc_op* op = fc_op_new(run);
  if (op != NULL) op->marker = marker;
  return op;
}

fc_op* fc_record_op(fc_marker* marker) { return markerOp(marker, runRecord); }
fc_op* fc_wait_op(fc_marker* marker) { return markerOp(marker, runWait); }

static fc_event* findLocked(void* handle) {
  for (fc_event* e = events; e != NULL; e = e->next) {
    if (e == handle) return e;
  }
  return NULL;
}

FC_API int cudaEventCreateWithFlags(void** event, unsigned flags) {
  fc_count(FC_CALL_cudaEventCreateWithFlags);
  /* timing is never measured; CUDA wants an interprocess event without timing */
  if (event == NULL || flags > 7) return kCudaErrorInvalidValue;
  if ((flags & EVENT_INTERPROCESS) && !(flags & EVENT_DISABLE_TIMING)) {
    return kCudaErrorInvalidValue;
  }
  fc_event* e = calloc(1, sizeof(*e));
  if (e == NULL) return kCudaErrorMemoryAllocation;
  e->device = fc_current_device();
  if (flags & EVENT_INTERPROCESS) {
    e->shared = fc_shared_event_new();
    if (e->shared == NULL) {
      free(e);
      return kCudaErrorMemoryAllocation;
    }
  }
  pthread_mutex_lock(&fc_mu);
  e->next = events;
  events = e;
  pthread_mutex_unlock(&fc_mu);
  *event = e;
  return kCudaSuccess;
}

FC_API int cudaEventDestroy(void* event) {
  fc_count(FC_CALL_cudaEventDestroy);
  pthread_mutex_lock(&fc_mu);
  fc_event* e = findLocked(event);
  if (e != NULL) {
    for (fc_event** p = &events; *p != NULL; p = &(*p)->next) {
      if (*p == e) {
        *p = e->next;
        break;
      }
    }
    markerReleaseLocked(e->latest);  /* a queued record still holds its own reference */
    if (e->shared != NULL) fc_shared_event_free(e->shared);  /* so do queued ops */
    free(e);
  }
  pthread_mutex_unlock(&fc_mu);
  return e != NULL ? kCudaSuccess : kCudaErrorInvalidResourceHandle;
}

/* Note [Event records]. */
FC_API int cudaEventRecord(void* event, void* stream) {
  fc_count(FC_CALL_cudaEventRecord);
  pthread_mutex_lock(&fc_mu);
  int result = kCudaErrorInvalidResourceHandle;
  fc_event* e = findLocked(event);
  if (e != NULL && fc_check_stream_locked(stream) == kCudaSuccess &&
      fc_stream_device_locked(stream) != e->device) {
    pthread_mutex_unlock(&fc_mu);  /* CUDA: an event records only on a stream of its device */
    return kCudaErrorInvalidResourceHandle;
  }
  if (e != NULL && e->shared != NULL) {
    result = fc_shared_event_record_locked(e->shared, stream);
    pthread_mutex_unlock(&fc_mu);
    return result;
  }
  fc_marker* marker = e != NULL ? fc_marker_new_locked(2) : NULL;  /* event + record op */
  if (marker != NULL) {
    result = fc_enqueue_locked(stream, fc_record_op(marker));
    if (result == kCudaSuccess) {
      markerReleaseLocked(e->latest);
      e->latest = marker;
    } else {
      free(marker);
    }
  } else if (e != NULL) {
    result = kCudaErrorMemoryAllocation;
  }
  pthread_mutex_unlock(&fc_mu);
  return result;
}

FC_API int cudaEventQuery(void* event) {
  fc_count(FC_CALL_cudaEventQuery);
  pthread_mutex_lock(&fc_mu);
  fc_event* e = findLocked(event);
  const int result = e == NULL ? kCudaErrorInvalidResourceHandle
                     : e->shared != NULL ? (fc_shared_event_done(e->shared) ? kCudaSuccess
                                                                           : kCudaErrorNotReady)
                     : e->latest == NULL || e->latest->done ? kCudaSuccess
                                                            : kCudaErrorNotReady;
  pthread_mutex_unlock(&fc_mu);
  return result;
}

FC_API int cudaEventSynchronize(void* event) {
  fc_count(FC_CALL_cudaEventSynchronize);
  pthread_mutex_lock(&fc_mu);
  fc_event* e = findLocked(event);
  fc_marker* marker = e != NULL ? e->latest : NULL;
  while (e != NULL && e->shared != NULL && !fc_shared_event_done(e->shared)) {
    pthread_mutex_unlock(&fc_mu);  /* fired by another process: no condition to wait on */
    nanosleep(&(struct timespec){0, 1000 * 1000}, NULL);
    pthread_mutex_lock(&fc_mu);
    e = findLocked(event);
  }
  if (marker != NULL) {
    marker->refs++;  /* the event may be re-recorded or destroyed while we sleep */
    while (!marker->done) pthread_cond_wait(&fc_done_cv, &fc_mu);
    markerReleaseLocked(marker);
  }
  pthread_mutex_unlock(&fc_mu);
  return e != NULL ? kCudaSuccess : kCudaErrorInvalidResourceHandle;
}

/* Note [Event records]: the wait is for the record as it stands now. flags: 0 (or 1,
 * cudaEventWaitExternal, which means the same here). */
FC_API int cudaStreamWaitEvent(void* stream, void* event, unsigned flags) {
  fc_count(FC_CALL_cudaStreamWaitEvent);
  if (flags > 1) return kCudaErrorInvalidValue;
  pthread_mutex_lock(&fc_mu);
  int result = kCudaErrorInvalidResourceHandle;
  fc_event* e = findLocked(event);
  if (e != NULL && e->shared != NULL) {
    result = fc_shared_event_wait_locked(e->shared, stream);
  } else if (e != NULL) {
    fc_marker* marker = e->latest;
    if (marker != NULL && !marker->done) {
      marker->refs++;
      result = fc_enqueue_locked(stream, fc_wait_op(marker));
      if (result != kCudaSuccess) marker->refs--;
    } else {  /* nothing left to wait for */
      result = fc_check_stream_locked(stream);
    }
  }
  pthread_mutex_unlock(&fc_mu);
  return result;
}

fc_shared_event* fc_event_shared_locked(void* event) {
  fc_event* e = findLocked(event);
  return e != NULL ? e->shared : NULL;
}

int fc_event_adopt(void** event, fc_shared_event* shared) {
  fc_event* e = calloc(1, sizeof(*e));
  if (e == NULL) return kCudaErrorMemoryAllocation;
  e->device = fc_current_device();
  e->shared = shared;
  pthread_mutex_lock(&fc_mu);
  e->next = events;
  events = e;
  pthread_mutex_unlock(&fc_mu);
  *event = e;
  return kCudaSuccess;
}

static void runBlock(fc_op* op) {
  pthread_mutex_lock(&fc_mu);
  while (!op->blocker->released) {
    fakeCudaWorkerParks(1);
    pthread_cond_wait(&fc_done_cv, &fc_mu);
    fakeCudaWorkerParks(0);
  }
  free(op->blocker);
  pthread_mutex_unlock(&fc_mu);
}

/* Test kernel: blocks `stream` until fakeCudaReleaseBlocker(token). Returns the token (> 0),
 * or minus a cudaError_t. */
FC_API long fakeCudaLaunchBlocker(void* stream) {
  pthread_mutex_lock(&fc_mu);
  fc_blocker* blocker = calloc(1, sizeof(*blocker));
  fc_op* op = fc_op_new(runBlock);
  long result = -kCudaErrorMemoryAllocation;
  if (blocker != NULL && op != NULL) {
    op->blocker = blocker;
    result = -fc_enqueue_locked(stream, op);
    op = NULL;  /* taken by the enqueue */
    if (result == 0) {
      blocker->token = result = next_token++;
      blocker->next = blockers;
      blockers = blocker;
      blocker = NULL;
    }
  }
  pthread_mutex_unlock(&fc_mu);
  free(blocker);
  free(op);
  return result;
}

/* 0, or cudaErrorInvalidValue for a token that is unknown or already released. */
FC_API int fakeCudaReleaseBlocker(long token) {
  pthread_mutex_lock(&fc_mu);
  fc_blocker** p = &blockers;
  while (*p != NULL && (*p)->token != token) p = &(*p)->next;
  fc_blocker* found = *p;
  if (found != NULL) {
    *p = found->next;
    found->released = 1;  /* runBlock frees it */
    pthread_cond_broadcast(&fc_done_cv);
  }
  pthread_mutex_unlock(&fc_mu);
  return found != NULL ? kCudaSuccess : kCudaErrorInvalidValue;
}

FC_API long fakeCudaLiveEvents(void) {
  long n = 0;
  pthread_mutex_lock(&fc_mu);
  for (fc_event* e = events; e != NULL; e = e->next) n++;
  pthread_mutex_unlock(&fc_mu);
  return n;
}
