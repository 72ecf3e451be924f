/* fake_nccl.h: what the fake NCCL's files share. A communicator is a folder named by the unique
 * id's random token (fake_nccl_comm.c): a control file every member maps, one outbox file per
 * member and one file per point-to-point message. Calls are queued on the caller's CUDA stream
 * as host functions of the fake cudart and run there (fake_nccl_exec.c); reductions are in
 * fake_nccl_reduce.c; the exported API in fake_nccl.c. Only FN_API symbols are exported. */
#pragma once

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define FN_API __attribute__((visibility("default")))

enum {  /* ncclResult_t */
  kNcclSuccess = 0,
  kNcclUnhandledCudaError = 1,
  kNcclSystemError = 2,
  kNcclInternalError = 3,
  kNcclInvalidArgument = 4,
  kNcclInvalidUsage = 5,
  kNcclRemoteError = 6,
  kNcclInProgress = 7,
};

enum { kNoStall = 0, kStallHang = 1, kStallFail = 2 };  /* FAKE_NCCL_INIT_STALL */

enum { kOpSum = 0, kOpProd = 1, kOpMax = 2, kOpMin = 3, kOpAvg = 4, kOpPreMulSum = 5 };
enum { kNumDataTypes = 10, kNumBuiltinOps = 5, kMaxUserOps = 64 };

/* The fake cudart's entry points this library calls (it links against it: build.py). */
int cudaGetDevice(int* device);
int cudaDeviceGetPCIBusId(char* bus_id, int length, int device);
int cudaLaunchHostFunc(void* stream, void (*fn)(void*), void* user_data);
void fakeCudaWorkerParks(int parked);  /* Note [Parked streams] in fake_cudart_stream.c */

/* A reduction with its scalar captured by value: PreMulSum's (in the dtype's terms), or none. */
typedef struct {
  int kind;
  int dtype;
  double scalar_float;
  int64_t scalar_int;
} fn_redop;

size_t fn_dtype_size(int dtype);  /* 0 for an unknown dtype */
/* out[i] = op over in[0][i], ..., in[n-1][i], folded in rank order (so every member computes
 * the same bits); out may alias any input. */
void fn_reduce(void* out, const void* const* in, int n, size_t count, const fn_redop* op);
/* Reads a scalar of `dtype` (host memory) for PreMulSum. */
void fn_read_scalar(const void* scalar, int dtype, fn_redop* op);

/* ---- shared control file (zero-filled is the valid initial state) ------------------------ */

typedef struct {
  char host[64];
  char bus_id[32];
  int32_t pid;
  int32_t fail_init;   /* FAKE_NCCL_FAIL_INIT on this member */
  int32_t multi_rank;  /* 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE on: two ranks per GPU allowed */
  uint32_t joined;     /* 1 once the fields above are written */
  uint32_t doorbell;   /* futex: bumped whenever something this member may wait for changes */
  uint32_t published;  /* seq of the collective whose input this member's outbox holds */
  uint32_t consumed;   /* seq of the last collective this member finished reading */
  uint32_t gone;       /* 1 once this member left (Note [Cleanup] in fake_nccl_comm.c) */
} fn_member;

typedef struct {
  uint32_t nranks;  /* set by the first member to arrive */
  uint32_t joined;  /* futex: members that joined */
  fn_member member[];  /* nranks of them, then nranks * nranks "sent" counters (uint32) */
} fn_ctl;

/* ---- one communicator handle of this process --------------------------------------------- */

typedef struct fn_comm {
  struct fn_comm* next_live;  /* in fake_nccl.c's list of valid handles */
  int rank;
  int nranks;
  double timeout_s;        /* FAKE_NCCL_TIMEOUT_S, read at init */
  char dir[512];           /* the communicator's folder */
  fn_ctl* ctl;
  size_t ctl_bytes;
  uint32_t* sent;          /* ctl: sent[src * nranks + dst] = last message seq posted */
  int* outbox_fd;          /* [nranks]: own outbox read-write, peers' read-only */
  /* Guarded by mu: */
  pthread_mutex_t mu;
  pthread_cond_t cv;       /* refs or executing changed */
  uint32_t next_seq;       /* collectives issued */
  uint32_t* send_seq;      /* [nranks]: messages issued to each peer */
  uint32_t* recv_seq;      /* [nranks]: receives issued from each peer */
  fn_redop user_ops[kMaxUserOps];
  int user_op_used[kMaxUserOps];
  int refs;                /* the handle + each queued batch */
  int executing;           /* batches running on a stream worker now */
  /* Atomics: */
  int aborted;
  int async_error;
  int has_left;            /* fn_comm_leave ran */
  int init_state;          /* Note [Init states] in fake_nccl_comm.c */
  int stall;               /* FAKE_NCCL_INIT_STALL: kNoStall, kStallHang or kStallFail */
  int nonblocking;         /* made with config.blocking = 0 */
  int polls_in_progress;   /* Note [Calls in progress] in fake_nccl.c */
} fn_comm;

/* One call, queued as part of a batch (fake_nccl_exec.c). */
typedef enum { kAllReduce, kBroadcast, kReduce, kAllGather, kReduceScatter, kSend, kRecv } fn_kind;

typedef struct fn_call {
  struct fn_call* next;
  fn_kind kind;
  const void* send;
  void* recv;
  size_t count;
  int dtype;
  fn_redop op;
  int peer;        /* root for broadcast/reduce, peer for send/recv */
  uint32_t seq;    /* collective seq, or message seq on the (sender, receiver) pair */
  int fail;        /* FAKE_NCCL_FAIL_COLLECTIVE chose this call */
} fn_call;

int fn_version(void);  /* ncclGetVersion's answer: FAKE_NCCL_VERSION, default 2.28.9 */
double fn_env_seconds(const char* name, double fallback);  /* a positive number, or fallback */
double fn_now(void);                                        /* CLOCK_MONOTONIC, seconds */
void fn_futex_wait(uint32_t* word, uint32_t seen, double seconds);

const char* fn_kind_name(fn_kind kind);  /* "ncclAllReduce", ... */

int fn_comm_init(fn_comm** out, int nranks, const char id[128], int rank);  /* blocking */
/* Non-blocking init (Note [Init states]): start returns the handle in progress; poll never
 * waits and returns ncclInProgress or the set-up's result. */
int fn_comm_start(fn_comm** out, int nranks, const char id[128], int rank);
int fn_comm_poll_init(fn_comm* comm);
void fn_comm_release(fn_comm* comm);  /* drops a reference; the last one leaves and frees */
void fn_comm_leave(fn_comm* comm);    /* Note [Cleanup]; idempotent, touches files only */
void fn_ring(fn_comm* comm, int rank);
void fn_make_token(char id[128]);

/* Host func: runs a batch (comm + calls), then drops the batch's comm reference. */
/* The calls of one communicator on one stream, run by one host func: a single call, or those
 * of a group (Note [Point-to-point] in fake_nccl_exec.c). Holds a comm reference. */
typedef struct fn_batch {
  struct fn_batch* next;  /* in the calling thread's open group */
  fn_comm* comm;
  void* stream;
  fn_call *calls, *last;
} fn_batch;
void fn_run_batch(void* batch);  /* host func; frees the batch and drops its reference */
void fn_free_calls(fn_call* calls);
