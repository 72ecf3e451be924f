/* fake_nccl_exec.c: running queued NCCL calls. Each batch is one cudaLaunchHostFunc host
 * function, so it runs on the caller's stream worker exactly where an NCCL kernel would, in
 * order with the stream's other work. Data crosses processes through the communicator's folder
 * (Note [Rendezvous folder] in fake_nccl_comm.c).
 *
 * Note [Collective protocol]: collectives are numbered per communicator in call order, the same
 * on every member (NCCL's rule: every member issues them in the same order). Collective k on
 * member r: (a) wait until every member, r included, consumed k-1, so nobody still reads r's
 * outbox and r's previous collective is over; (b) write r's input to its outbox, set
 * published[r] = k and ring every member; (c) wait until every member published k, read what r
 * needs from the outboxes and compute r's output; (d) set consumed[r] = k and ring every member.
 * Nobody overwrites an outbox before all read it ((a) of k+1 follows (d) of k everywhere).
 *
 * Note [Point-to-point]: messages are numbered per (sender, receiver) pair in call order. A
 * send writes msg.<src>.<dst>.<seq>, then sets sent[src][dst] = seq and rings dst; a receive
 * waits for sent[src][dst] >= seq, reads the file and deletes it. Sends never wait, so a batch
 * posts all its sends first, then runs its collectives in order, then its receives: the calls of
 * a group never deadlock each other.
 *
 * Note [Waiting]: a wait sleeps on this member's doorbell futex and re-checks its condition at
 * each ring. ncclCommAbort rings it: the call returns at once, outputs unspecified, and the rest
 * of the batch is skipped. After FAKE_NCCL_TIMEOUT_S the call records async error
 * ncclSystemError. Once a communicator is aborted or has an async error, its calls are skipped
 * and the stream goes on. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fake_nccl.h"

enum { kWaitAborted = -1 };

static long completed_calls;

FN_API long fakeNcclCollectives(void) {
  return __atomic_load_n(&completed_calls, __ATOMIC_RELAXED);
}

const char* fn_kind_name(fn_kind kind) {
  static const char* const names[] = {"ncclAllReduce", "ncclBroadcast", "ncclReduce",
                                      "ncclAllGather", "ncclReduceScatter", "ncclSend",
                                      "ncclRecv"};
  return names[kind];
}

static uint32_t load(const uint32_t* word) { return __atomic_load_n(word, __ATOMIC_SEQ_CST); }

/* ---- waiting (Note [Waiting]) -------------------------------------------------------------- */

typedef int (*fn_ready)(const fn_comm* comm, const fn_call* call);

static int allConsumedPrevious(const fn_comm* comm, const fn_call* call) {
  for (int r = 0; r < comm->nranks; ++r) {
    if (load(&comm->ctl->member[r].consumed) < call->seq - 1) return 0;
  }
  return 1;
}

static int allPublished(const fn_comm* comm, const fn_call* call) {
  for (int r = 0; r < comm->nranks; ++r) {
    if (load(&comm->ctl->member[r].published) < call->seq) return 0;
  }
  return 1;
}

static int messagePosted(const fn_comm* comm, const fn_call* call) {
  return load(&comm->sent[call->peer * comm->nranks + comm->rank]) >= call->seq;
}

/* kNcclSuccess once ready(); kWaitAborted; kNcclSystemError after the timeout (never when
 * `ready` is NULL: then only an abort ends the wait). */
static int waitFor(fn_comm* comm, fn_ready ready, const fn_call* call) {
  uint32_t* bell = &comm->ctl->member[comm->rank].doorbell;
  const double deadline = fn_now() + comm->timeout_s;
  for (;;) {
    const uint32_t seen = load(bell);  /* before the checks: a ring after them wakes us */
    if (__atomic_load_n(&comm->aborted, __ATOMIC_SEQ_CST)) return kWaitAborted;
    if (ready != NULL && ready(comm, call)) return kNcclSuccess;
    const double left = ready == NULL ? 3600 : deadline - fn_now();
    if (left <= 0) break;
    fakeCudaWorkerParks(1);  /* the batch runs on a stream's worker: Note [Parked streams] */
    fn_futex_wait(bell, seen, left);
    fakeCudaWorkerParks(0);
  }
  fprintf(stderr, "fake-nccl: rank %d: %s (seq %u) timed out after FAKE_NCCL_TIMEOUT_S=%gs "
          "waiting for", comm->rank, fn_kind_name(call->kind), call->seq, comm->timeout_s);
  for (int r = 0; r < comm->nranks; ++r) {
    const fn_member* m = &comm->ctl->member[r];
    const int missing = call->kind == kRecv ? r == call->peer
                        : ready == allPublished ? load(&m->published) < call->seq
                                                : load(&m->consumed) < call->seq - 1;
    if (missing) fprintf(stderr, " rank %d", r);
  }
  fprintf(stderr, "\n");
  return kNcclSystemError;
}

static void ringAll(fn_comm* comm) {
  for (int r = 0; r < comm->nranks; ++r) fn_ring(comm, r);
}

/* ---- files --------------------------------------------------------------------------------- */

static int writeAll(int fd, const void* data, size_t bytes, off_t offset) {
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = pwrite(fd, (const char*)data + done, bytes - done, offset + (off_t)done);
    if (n <= 0) return kNcclSystemError;
    done += (size_t)n;
  }
  return kNcclSuccess;
}

static int readAll(int fd, void* data, size_t bytes, off_t offset) {
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = pread(fd, (char*)data + done, bytes - done, offset + (off_t)done);
    if (n <= 0) return kNcclSystemError;  /* 0: the file is shorter than the protocol says */
    done += (size_t)n;
  }
  return kNcclSuccess;
}

/* ---- collectives (Note [Collective protocol]) ---------------------------------------------- */

static size_t inputBytes(const fn_comm* comm, const fn_call* call) {
  const size_t bytes = call->count * fn_dtype_size(call->dtype);
  switch (call->kind) {
    case kBroadcast: return comm->rank == call->peer ? bytes : 0;
    case kReduceScatter: return bytes * (size_t)comm->nranks;
    default: return bytes;
  }
}

/* Reduces block `offset` of every member's input into call->recv. */
static int reduceFromOutboxes(const fn_comm* comm, const fn_call* call, size_t offset) {
  const int n = comm->nranks;
  const size_t bytes = call->count * fn_dtype_size(call->dtype);
  const void** inputs = calloc((size_t)n, sizeof(*inputs));
  char* scratch = malloc(bytes * (size_t)(n - 1) + 1);
  int result = inputs != NULL && scratch != NULL ? kNcclSuccess : kNcclSystemError;
  for (int p = 0, slot = 0; p < n && result == kNcclSuccess; ++p) {
    if (p == comm->rank) {  /* own input straight from the caller's buffer (may be recv) */
      inputs[p] = (const char*)call->send + offset;
      continue;
    }
    inputs[p] = scratch + bytes * (size_t)slot++;
    result = readAll(comm->outbox_fd[p], (void*)inputs[p], bytes, (off_t)offset);
  }
  if (result == kNcclSuccess) fn_reduce(call->recv, inputs, n, call->count, &call->op);
  free(inputs);
  free(scratch);
  return result;
}

/* (c) of Note [Collective protocol], once every input is published. */
static int computeOutput(const fn_comm* comm, const fn_call* call) {
  const size_t bytes = call->count * fn_dtype_size(call->dtype);
  const int rank = comm->rank;
  switch (call->kind) {
    case kBroadcast:
      if (rank != call->peer) return readAll(comm->outbox_fd[call->peer], call->recv, bytes, 0);
      if (call->send != call->recv) memmove(call->recv, call->send, bytes);
      return kNcclSuccess;
    case kAllGather:
      for (int p = 0; p < comm->nranks; ++p) {
        char* block = (char*)call->recv + bytes * (size_t)p;
        if (p == rank) {
          if (block != call->send) memmove(block, call->send, bytes);
        } else if (readAll(comm->outbox_fd[p], block, bytes, 0) != kNcclSuccess) {
          return kNcclSystemError;
        }
      }
      return kNcclSuccess;
    case kReduce:
      return rank == call->peer ? reduceFromOutboxes(comm, call, 0) : kNcclSuccess;
    case kReduceScatter:
      return reduceFromOutboxes(comm, call, bytes * (size_t)rank);
    default:
      return reduceFromOutboxes(comm, call, 0);
  }
}

static int runCollective(fn_comm* comm, const fn_call* call) {
  fn_member* me = &comm->ctl->member[comm->rank];
  int result = waitFor(comm, allConsumedPrevious, call);  /* (a) */
  if (result != kNcclSuccess) return result;
  result = writeAll(comm->outbox_fd[comm->rank], call->send, inputBytes(comm, call), 0);
  if (result != kNcclSuccess) return result;
  __atomic_store_n(&me->published, call->seq, __ATOMIC_SEQ_CST);  /* (b) */
  ringAll(comm);
  result = waitFor(comm, allPublished, call);  /* (c) */
  if (result != kNcclSuccess) return result;
  result = computeOutput(comm, call);
  __atomic_store_n(&me->consumed, call->seq, __ATOMIC_SEQ_CST);  /* (d) */
  ringAll(comm);
  return result;
}

/* ---- point-to-point (Note [Point-to-point]) ------------------------------------------------ */

static void messagePath(const fn_comm* comm, int src, int dst, uint32_t seq, char* out,
                        size_t size) {
  snprintf(out, size, "%s/msg.%d.%d.%u", comm->dir, src, dst, seq);
}

static int runSend(fn_comm* comm, const fn_call* call) {
  char path[600];
  messagePath(comm, comm->rank, call->peer, call->seq, path, sizeof(path));
  const int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0) return kNcclSystemError;
  const int result = writeAll(fd, call->send, call->count * fn_dtype_size(call->dtype), 0);
  close(fd);
  if (result != kNcclSuccess) return result;
  __atomic_store_n(&comm->sent[comm->rank * comm->nranks + call->peer], call->seq,
                   __ATOMIC_SEQ_CST);
  fn_ring(comm, call->peer);
  return kNcclSuccess;
}

static int runRecv(fn_comm* comm, const fn_call* call) {
  const int result = waitFor(comm, messagePosted, call);
  if (result != kNcclSuccess) return result;
  char path[600];
  messagePath(comm, call->peer, comm->rank, call->seq, path, sizeof(path));
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return kNcclSystemError;
  struct stat info;
  const size_t bytes = call->count * fn_dtype_size(call->dtype);
  int status = fstat(fd, &info) == 0 ? kNcclSuccess : kNcclSystemError;
  if (status == kNcclSuccess && (size_t)info.st_size != bytes) {
    fprintf(stderr, "fake-nccl: rank %d: ncclRecv of %zu bytes from rank %d, which sent %zu\n",
            comm->rank, bytes, call->peer, (size_t)info.st_size);
    status = kNcclInvalidUsage;
  }
  if (status == kNcclSuccess) status = readAll(fd, call->recv, bytes, 0);
  close(fd);
  unlink(path);
  return status;
}

/* ---- batches ------------------------------------------------------------------------------- */

static void recordError(fn_comm* comm, int error) {
  int expected = kNcclSuccess;
  __atomic_compare_exchange_n(&comm->async_error, &expected, error, 0, __ATOMIC_SEQ_CST,
                              __ATOMIC_SEQ_CST);
}

static void runCall(fn_comm* comm, const fn_call* call) {
  if (__atomic_load_n(&comm->aborted, __ATOMIC_SEQ_CST) ||
      __atomic_load_n(&comm->async_error, __ATOMIC_SEQ_CST) != kNcclSuccess) {
    return;
  }
  if (call->fail) {  /* FAKE_NCCL_FAIL_COLLECTIVE: fail like a real NCCL, hanging until abort */
    fprintf(stderr, "fake-nccl: rank %d: %s failed (FAKE_NCCL_FAIL_COLLECTIVE)\n", comm->rank,
            fn_kind_name(call->kind));
    recordError(comm, kNcclSystemError);
    waitFor(comm, NULL, call);
    return;
  }
  const int result = call->kind == kSend   ? runSend(comm, call)
                     : call->kind == kRecv ? runRecv(comm, call)
                                           : runCollective(comm, call);
  if (result == kNcclSuccess) {
    __atomic_fetch_add(&completed_calls, 1, __ATOMIC_RELAXED);
  } else if (result != kWaitAborted) {
    recordError(comm, result);
  }
}

void fn_free_calls(fn_call* calls) {
  while (calls != NULL) {
    fn_call* next = calls->next;
    free(calls);
    calls = next;
  }
}

void fn_run_batch(void* arg) {
  fn_batch* batch = arg;
  fn_comm* comm = batch->comm;
  pthread_mutex_lock(&comm->mu);
  comm->executing++;
  pthread_mutex_unlock(&comm->mu);
  for (int phase = 0; phase < 3; ++phase) {  /* sends, collectives, receives */
    for (const fn_call* call = batch->calls; call != NULL; call = call->next) {
      const int call_phase = call->kind == kSend ? 0 : call->kind == kRecv ? 2 : 1;
      if (call_phase == phase) runCall(comm, call);
    }
  }
  pthread_mutex_lock(&comm->mu);
  comm->executing--;
  pthread_cond_broadcast(&comm->cv);  /* an abort may wait for executing == 0 */
  pthread_mutex_unlock(&comm->mu);
  fn_free_calls(batch->calls);
  free(batch);
  fn_comm_release(comm);
}
