/* fake_nccl.c: the exported API of the fake NCCL (libnccl.so.2). Calls are checked and queued
 * here, on the caller's thread; they run later on the stream (fake_nccl_exec.c). Handles are
 * checked against the live list, so a call on a destroyed or aborted communicator is
 * ncclInvalidArgument (with a line on stderr) instead of a crash.
 *
 * Note [Groups]: between ncclGroupStart and ncclGroupEnd (per thread, nestable) calls are
 * gathered into one batch per (communicator, stream), in order of first use, and queued at the
 * outermost ncclGroupEnd, one host func per batch.
 *
 * Environment: FAKE_NCCL_VERSION (ncclGetVersion, default 22809), FAKE_NCCL_FAIL_COLLECTIVE=k
 * (this process's k-th call counting every collective, send and receive, 1-based, read once,
 * records async error ncclSystemError and hangs until ncclCommAbort); the others (the init
 * hooks FAKE_NCCL_FAIL_INIT and FAKE_NCCL_INIT_STALL among them) are read in fake_nccl_comm.c.
 *
 * Note [Calls in progress]: on a communicator made with blocking = 0, NCCL may answer any call
 * ncclInProgress (the call is under way: since 2.22 a group's end may still be connecting
 * peers), and the caller must then poll ncclCommGetAsyncError until it leaves that state before
 * its next call on the communicator. With FAKE_NCCL_CALLS_IN_PROGRESS=1 every collective
 * outside a group and every ncclGroupEnd on such a communicator does its work and answers so;
 * ncclCommGetAsyncError then reports ncclInProgress for two polls; a call made before that is
 * refused with ncclInvalidUsage and a line on stderr, as a caller that did not wait. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fake_nccl.h"

#define DEFAULT_VERSION 22809  /* 2.28.9 */

typedef struct {
  char internal[128];
} fn_unique_id;  /* ncclUniqueId, passed by value to ncclCommInitRank */

static pthread_mutex_t live_mu = PTHREAD_MUTEX_INITIALIZER;
static fn_comm* live;  /* handles not yet destroyed or aborted */
static pthread_once_t env_once = PTHREAD_ONCE_INIT;
static long fail_at;   /* FAKE_NCCL_FAIL_COLLECTIVE, 0 for none */
static long issued;    /* calls issued by this process */
static int calls_in_progress;  /* FAKE_NCCL_CALLS_IN_PROGRESS: Note [Calls in progress] */
static __thread int group_depth;
static __thread fn_batch* group_batches;
static __thread int group_error;

static void readEnv(void) {
  const char* fail = getenv("FAKE_NCCL_FAIL_COLLECTIVE");
  fail_at = fail != NULL ? atol(fail) : 0;
  const char* in_progress = getenv("FAKE_NCCL_CALLS_IN_PROGRESS");
  calls_in_progress = in_progress != NULL && strcmp(in_progress, "1") == 0;
}

/* Note [Calls in progress]: a call on a communicator whose last call is still in progress. */
static int stillInProgress(fn_comm* comm, const char* call) {
  if (__atomic_load_n(&comm->polls_in_progress, __ATOMIC_SEQ_CST) == 0) return 0;
  fprintf(stderr, "fake-nccl: %s while the communicator's last call is in progress (poll "
          "ncclCommGetAsyncError until it is not)\n", call);
  return 1;
}

/* A call that did its work: answered ncclInProgress where Note [Calls in progress] says so. */
static int answer(fn_comm* comm, int result) {
  pthread_once(&env_once, readEnv);
  if (result != kNcclSuccess || !calls_in_progress || !comm->nonblocking) return result;
  __atomic_store_n(&comm->polls_in_progress, 2, __ATOMIC_SEQ_CST);
  return kNcclInProgress;
}

int fn_version(void) {
  const char* text = getenv("FAKE_NCCL_VERSION");
  return text != NULL && atoi(text) > 0 ? atoi(text) : DEFAULT_VERSION;
}

FN_API int ncclGetVersion(int* version) {
  if (version == NULL) return kNcclInvalidArgument;
  *version = fn_version();
  return kNcclSuccess;
}

FN_API const char* ncclGetErrorString(int result) {
  switch (result) {
    case kNcclSuccess: return "no error";
    case kNcclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case kNcclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case kNcclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case kNcclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case kNcclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case kNcclRemoteError: return "remote process exited or there was a network error";
    case 7: return "NCCL operation in progress";
    default: return "unknown result code";
  }
}

FN_API int ncclGetUniqueId(fn_unique_id* id) {
  if (id == NULL) return kNcclInvalidArgument;
  fn_make_token(id->internal);
  return kNcclSuccess;
}

FN_API int ncclCommInitRank(fn_comm** comm, int nranks, fn_unique_id id, int rank) {
  const int result = fn_comm_init(comm, nranks, id.internal, rank);
  if (result != kNcclSuccess) return result;
  pthread_mutex_lock(&live_mu);
  (*comm)->next_live = live;
  live = *comm;
  pthread_mutex_unlock(&live_mu);
  return kNcclSuccess;
}

/* ncclConfig_t's leading fields, which every version has (nccl.h since 2.14). */
typedef struct {
  size_t size;
  unsigned int magic;
  unsigned int version;
  int blocking;
} fn_config;

/* blocking = 0: Note [Init states] in fake_nccl_comm.c; anything else blocks as
 * ncclCommInitRank does (NCCL's default). */
FN_API int ncclCommInitRankConfig(fn_comm** comm, int nranks, fn_unique_id id, int rank,
                                  const fn_config* config) {
  if (config != NULL && (config->magic != 0xcafebeef || config->size < sizeof(fn_config))) {
    fprintf(stderr, "fake-nccl: ncclConfig_t argument not initialized via "
            "NCCL_CONFIG_INITIALIZER\n");
    return kNcclInvalidArgument;
  }
  if (config == NULL || config->blocking != 0) return ncclCommInitRank(comm, nranks, id, rank);
  const int result = fn_comm_start(comm, nranks, id.internal, rank);
  if (result != kNcclSuccess) return result;
  (*comm)->nonblocking = 1;
  pthread_mutex_lock(&live_mu);
  (*comm)->next_live = live;
  live = *comm;
  pthread_mutex_unlock(&live_mu);
  return kNcclInProgress;
}

/* 1 if `comm` is a live handle; with `unlink`, it stops being one. */
static int checkHandle(fn_comm* comm, const char* call, int unlink) {
  pthread_mutex_lock(&live_mu);
  fn_comm** p = &live;
  while (*p != NULL && *p != comm) p = &(*p)->next_live;
  const int found = comm != NULL && *p == comm;
  if (found && unlink) *p = comm->next_live;
  pthread_mutex_unlock(&live_mu);
  if (!found) fprintf(stderr, "fake-nccl: %s: %p is not a live communicator\n", call, comm);
  return found;
}

/* Waits for every queued batch of the communicator, then frees it. */
FN_API int ncclCommDestroy(fn_comm* comm) {
  if (!checkHandle(comm, "ncclCommDestroy", 1)) return kNcclInvalidArgument;
  pthread_mutex_lock(&comm->mu);
  while (comm->refs > 1) pthread_cond_wait(&comm->cv, &comm->mu);
  pthread_mutex_unlock(&comm->mu);
  fn_comm_release(comm);
  return kNcclSuccess;
}

/* Note [Waiting] in fake_nccl_exec.c: the running call returns at once; queued ones are
 * skipped and drop their references when their streams reach them. */
FN_API int ncclCommAbort(fn_comm* comm) {
  if (!checkHandle(comm, "ncclCommAbort", 1)) return kNcclInvalidArgument;
  __atomic_store_n(&comm->aborted, 1, __ATOMIC_SEQ_CST);
  if (comm->ctl != NULL) fn_ring(comm, comm->rank);  /* NULL: never joined (Note [Init states]) */
  pthread_mutex_lock(&comm->mu);
  while (comm->executing > 0) pthread_cond_wait(&comm->cv, &comm->mu);
  pthread_mutex_unlock(&comm->mu);
  fn_comm_release(comm);
  return kNcclSuccess;
}

FN_API int ncclCommGetAsyncError(fn_comm* comm, int* result) {
  if (result == NULL || !checkHandle(comm, "ncclCommGetAsyncError", 0)) {
    return kNcclInvalidArgument;
  }
  const int init = fn_comm_poll_init(comm);  /* Note [Init states] */
  *result = init != kNcclSuccess ? init : __atomic_load_n(&comm->async_error, __ATOMIC_SEQ_CST);
  int polls = __atomic_load_n(&comm->polls_in_progress, __ATOMIC_SEQ_CST);
  while (*result == kNcclSuccess && polls > 0) {  /* Note [Calls in progress] */
    if (__atomic_compare_exchange_n(&comm->polls_in_progress, &polls, polls - 1, 0,
                                    __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
      *result = kNcclInProgress;
    }
  }
  return kNcclSuccess;
}

FN_API int ncclRedOpCreatePreMulSum(int* op, void* scalar, int dtype, int residence,
                                    fn_comm* comm) {
  if (op == NULL || scalar == NULL || fn_dtype_size(dtype) == 0 || residence != 1 ||
      !checkHandle(comm, "ncclRedOpCreatePreMulSum", 0)) {
    return kNcclInvalidArgument;  /* residence 1: ncclScalarHostImmediate, read now */
  }
  int result = kNcclInvalidUsage;  /* every slot taken: ops were not destroyed */
  pthread_mutex_lock(&comm->mu);
  for (int i = 0; i < kMaxUserOps; ++i) {
    if (comm->user_op_used[i]) continue;
    fn_redop* slot = &comm->user_ops[i];
    memset(slot, 0, sizeof(*slot));
    slot->kind = kOpPreMulSum;
    slot->dtype = dtype;
    fn_read_scalar(scalar, dtype, slot);
    comm->user_op_used[i] = 1;
    *op = kNumBuiltinOps + i;
    result = kNcclSuccess;
    break;
  }
  pthread_mutex_unlock(&comm->mu);
  return result;
}

FN_API int ncclRedOpDestroy(int op, fn_comm* comm) {
  if (!checkHandle(comm, "ncclRedOpDestroy", 0)) return kNcclInvalidArgument;
  const int index = op - kNumBuiltinOps;
  pthread_mutex_lock(&comm->mu);
  const int found = index >= 0 && index < kMaxUserOps && comm->user_op_used[index];
  if (found) comm->user_op_used[index] = 0;
  pthread_mutex_unlock(&comm->mu);
  return found ? kNcclSuccess : kNcclInvalidArgument;
}

/* ---- queuing ------------------------------------------------------------------------------- */

/* The reduction `op` names for `dtype`, copied (an op may be destroyed once the call returns). */
static int resolveOp(fn_comm* comm, int op, int dtype, fn_redop* out) {
  memset(out, 0, sizeof(*out));
  out->kind = op;
  out->dtype = dtype;
  if (op >= 0 && op < kNumBuiltinOps) return kNcclSuccess;
  const int index = op - kNumBuiltinOps;
  pthread_mutex_lock(&comm->mu);
  const int ok = index >= 0 && index < kMaxUserOps && comm->user_op_used[index] &&
                 comm->user_ops[index].dtype == dtype;
  if (ok) *out = comm->user_ops[index];
  pthread_mutex_unlock(&comm->mu);
  return ok ? kNcclSuccess : kNcclInvalidArgument;
}

static fn_batch* newBatch(fn_comm* comm, void* stream) {
  fn_batch* batch = calloc(1, sizeof(*batch));
  if (batch == NULL) return NULL;
  batch->comm = comm;
  batch->stream = stream;
  pthread_mutex_lock(&comm->mu);
  comm->refs++;  /* dropped by fn_run_batch, or by dropBatch when queuing fails */
  pthread_mutex_unlock(&comm->mu);
  return batch;
}

static void dropBatch(fn_batch* batch) {
  fn_free_calls(batch->calls);
  fn_comm_release(batch->comm);
  free(batch);
}

static void append(fn_batch* batch, fn_call* call) {
  if (batch->last != NULL) {
    batch->last->next = call;
  } else {
    batch->calls = call;
  }
  batch->last = call;
}

/* The open group's batch for (comm, stream), made and added on first use. */
static fn_batch* groupBatch(fn_comm* comm, void* stream) {
  fn_batch** tail = &group_batches;
  for (; *tail != NULL; tail = &(*tail)->next) {
    if ((*tail)->comm == comm && (*tail)->stream == stream) return *tail;
  }
  return *tail = newBatch(comm, stream);
}

/* Numbers the call (Notes [Collective protocol] and [Point-to-point] in fake_nccl_exec.c) and
 * queues it, or adds it to the open group (Note [Groups]). Numbering and queuing happen under
 * comm->mu, so calls from several threads keep their numbers' order on a stream. Takes `call`. */
static int issue(fn_comm* comm, void* stream, fn_call* call) {
  pthread_once(&env_once, readEnv);
  call->fail = fail_at > 0 && __atomic_add_fetch(&issued, 1, __ATOMIC_SEQ_CST) == fail_at;
  fn_batch* batch = group_depth > 0 ? groupBatch(comm, stream) : newBatch(comm, stream);
  if (batch == NULL) {
    free(call);
    return kNcclSystemError;
  }
  pthread_mutex_lock(&comm->mu);
  call->seq = call->kind == kSend   ? ++comm->send_seq[call->peer]
              : call->kind == kRecv ? ++comm->recv_seq[call->peer]
                                    : ++comm->next_seq;
  append(batch, call);
  const int queued = group_depth > 0 || cudaLaunchHostFunc(stream, fn_run_batch, batch) == 0;
  pthread_mutex_unlock(&comm->mu);
  if (queued) return kNcclSuccess;
  dropBatch(batch);
  return kNcclUnhandledCudaError;
}

/* Checks what every call shares, then issues it. */
static int enqueue(fn_kind kind, const void* send, void* recv, size_t count, int dtype, int op,
                   int peer, fn_comm* comm, void* stream) {
  if (!checkHandle(comm, fn_kind_name(kind), 0)) return kNcclInvalidArgument;
  if (stillInProgress(comm, fn_kind_name(kind))) return kNcclInvalidUsage;
  const int pending = __atomic_load_n(&comm->async_error, __ATOMIC_SEQ_CST);
  if (pending != kNcclSuccess) return pending;  /* as NCCL: a broken comm refuses new work */
  const int uses_peer = kind == kBroadcast || kind == kReduce || kind == kSend || kind == kRecv;
  const int reads = kind != kRecv, writes = kind != kSend;
  if (fn_dtype_size(dtype) == 0 || (uses_peer && (peer < 0 || peer >= comm->nranks)) ||
      (count > 0 && ((reads && send == NULL && !(kind == kBroadcast && peer != comm->rank)) ||
                     (writes && recv == NULL)))) {
    return kNcclInvalidArgument;
  }
  fn_call* call = calloc(1, sizeof(*call));
  if (call == NULL) return kNcclSystemError;
  *call = (fn_call){.kind = kind, .send = send, .recv = recv, .count = count, .dtype = dtype,
                    .peer = peer};
  const int reduces = kind == kAllReduce || kind == kReduce || kind == kReduceScatter;
  if (reduces && resolveOp(comm, op, dtype, &call->op) != kNcclSuccess) {
    free(call);
    return kNcclInvalidArgument;
  }
  call->op.dtype = dtype;
  const int result = issue(comm, stream, call);
  return group_depth > 0 ? result : answer(comm, result);  /* a group's end answers for it */
}

/* Inside a group, a failed call also fails the ncclGroupEnd that closes it, as in NCCL. */
static int remember(int result) {
  if (group_depth > 0 && result != kNcclSuccess && group_error == kNcclSuccess) {
    group_error = result;
  }
  return result;
}

FN_API int ncclAllReduce(const void* send, void* recv, size_t count, int dtype, int op,
                         fn_comm* comm, void* stream) {
  return remember(enqueue(kAllReduce, send, recv, count, dtype, op, 0, comm, stream));
}

FN_API int ncclBroadcast(const void* send, void* recv, size_t count, int dtype, int root,
                         fn_comm* comm, void* stream) {
  return remember(enqueue(kBroadcast, send, recv, count, dtype, 0, root, comm, stream));
}

FN_API int ncclReduce(const void* send, void* recv, size_t count, int dtype, int op, int root,
                      fn_comm* comm, void* stream) {
  return remember(enqueue(kReduce, send, recv, count, dtype, op, root, comm, stream));
}

FN_API int ncclAllGather(const void* send, void* recv, size_t send_count, int dtype,
                         fn_comm* comm, void* stream) {
  return remember(enqueue(kAllGather, send, recv, send_count, dtype, 0, 0, comm, stream));
}

FN_API int ncclReduceScatter(const void* send, void* recv, size_t recv_count, int dtype, int op,
                             fn_comm* comm, void* stream) {
  return remember(enqueue(kReduceScatter, send, recv, recv_count, dtype, op, 0, comm, stream));
}

FN_API int ncclSend(const void* send, size_t count, int dtype, int peer, fn_comm* comm,
                    void* stream) {
  return remember(enqueue(kSend, send, NULL, count, dtype, 0, peer, comm, stream));
}

FN_API int ncclRecv(void* recv, size_t count, int dtype, int peer, fn_comm* comm, void* stream) {
  return remember(enqueue(kRecv, NULL, recv, count, dtype, 0, peer, comm, stream));
}

FN_API int ncclGroupStart(void) {
  group_depth++;
  return kNcclSuccess;
}

/* Note [Groups]: the outermost end queues every gathered batch; the first failure is returned. */
FN_API int ncclGroupEnd(void) {
  if (group_depth == 0) return kNcclInvalidUsage;
  if (--group_depth > 0) return kNcclSuccess;
  int result = group_error;
  fn_comm* answering = NULL;  /* Note [Calls in progress]: the group's communicator */
  while (group_batches != NULL) {
    fn_batch* batch = group_batches;
    group_batches = batch->next;
    answering = batch->comm;
    if (cudaLaunchHostFunc(batch->stream, fn_run_batch, batch) != 0) {
      dropBatch(batch);
      if (result == kNcclSuccess) result = kNcclUnhandledCudaError;
    }
  }
  if (answering != NULL) result = answer(answering, result);
  group_error = kNcclSuccess;
  return result;
}

/* Note [Cleanup] in fake_nccl_comm.c: a process exiting with communicators open leaves their
 * folders as if it had destroyed them (files only: stream workers may still be running).
 * Exported for a process that ends in _exit (tests/multiproc/zygote.py), where no destructor
 * runs; it must be the process's last use of this library. */
FN_API void fakenccl_leave_all(void) {
  pthread_mutex_lock(&live_mu);
  for (fn_comm* comm = live; comm != NULL; comm = comm->next_live) fn_comm_leave(comm);
  live = NULL;
  pthread_mutex_unlock(&live_mu);
}

__attribute__((destructor)) static void leaveAtExit(void) { fakenccl_leave_all(); }
