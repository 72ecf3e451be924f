/* fake_nccl_comm.c: a fake NCCL communicator's life: the unique id, the rendezvous of
 * ncclCommInitRank, and leaving (Note [Cleanup]: the last member out removes the folder).
 *
 * Note [Rendezvous folder]: the id holds "FAKENCCL" and 16 random bytes; the folder is
 * <base>/fakenccl-<32 hex digits>, base being $FAKE_NCCL_DIR, else /dev/shm, else $TMPDIR or
 * /tmp, resolved by each member from its own environment. It holds "ctl" (an fn_ctl, mapped
 * shared by every member), "out.<rank>" (each member's outbox) and "msg.<src>.<dst>.<seq>"
 * (point-to-point messages not yet received).
 *
 * Note [Init protocol]: (a) ask the fake cudart for the current device's PCI bus id (before
 * touching any file); mkdir the folder (whoever is first), map ctl, claim `nranks`; (b) claim
 * member[rank] and create this member's outbox; (c) write host, bus id, pid, the
 * FAKE_NCCL_FAIL_INIT flag and the multi-rank opt-in into member[rank], then count this member in
 * ctl->joined (futex) and wake the others; (d) sleep until joined == nranks or
 * FAKE_NCCL_INIT_TIMEOUT_S (default 60) passes; (e) every member checks the same table, so all
 * agree: a failing member gets ncclSystemError and the others ncclRemoteError; two members on one
 * (host, bus id) give every member ncclInvalidUsage, unless every member is 2.30+ with
 * NCCL_MULTI_RANK_GPU_ENABLE on (its table entry says so): then three do (at most two ranks per
 * GPU, NCCL 2.30's opt-in); (f) open every peer's outbox (before anyone can leave and unlink it).
 *
 * Note [Cleanup]: a member leaving marks itself gone; the member that then finds every other
 * one gone, never joined, or dead (its process exited or is a zombie: a crashed or killed rank)
 * removes the folder with whatever is left in it.
 *
 * Note [Init states]: ncclCommInitRankConfig with blocking = 0 does (a)-(c) and returns
 * ncclInProgress with the handle; ncclCommGetAsyncError then reports ncclInProgress until every
 * member joined, and then (e)'s result, doing (e) and (f) on that call (real NCCL finishes on a
 * thread of its own; a caller that polls sees the same states). ncclCommAbort ends a handle in
 * any state. FAKE_NCCL_INIT_STALL makes a member never join: "hang" stays in progress (a
 * blocking init sleeps until FAKE_NCCL_INIT_TIMEOUT_S), "fail" reports ncclSystemError at once
 * while its peers stay in progress — a member failing inside set-up. A process that exits with communicators open
 * leaves them too (fake_nccl.c), so a folder stays behind only when its last user is killed. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fake_nccl.h"

static const char kMagic[8] = {'F', 'A', 'K', 'E', 'N', 'C', 'C', 'L'};
enum { kTokenBytes = 16 };

static long live_comms;

FN_API long fakeNcclLiveComms(void) { return __atomic_load_n(&live_comms, __ATOMIC_RELAXED); }

double fn_env_seconds(const char* name, double fallback) {
  const char* text = getenv(name);
  char* end = NULL;
  const double value = text != NULL ? strtod(text, &end) : 0;
  return text != NULL && end != text && value > 0 ? value : fallback;
}

void fn_make_token(char id[128]) {
  memset(id, 0, 128);
  memcpy(id, kMagic, sizeof(kMagic));
  unsigned char* token = (unsigned char*)id + sizeof(kMagic);
  if (getrandom(token, kTokenBytes, 0) != kTokenBytes) {  /* never short for 16 bytes */
    for (int i = 0; i < kTokenBytes; ++i) token[i] = (unsigned char)(rand() ^ getpid() ^ i);
  }
}

static const char* baseDir(void) {
  const char* dir = getenv("FAKE_NCCL_DIR");
  if (dir != NULL && dir[0] != '\0') return dir;
  if (access("/dev/shm", W_OK | X_OK) == 0) return "/dev/shm";
  dir = getenv("TMPDIR");
  return dir != NULL && dir[0] != '\0' ? dir : "/tmp";
}

/* ---- futex waits --------------------------------------------------------------------------- */

void fn_futex_wait(uint32_t* word, uint32_t seen, double seconds) {
  struct timespec limit = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
  syscall(SYS_futex, word, FUTEX_WAIT, seen, &limit, NULL, 0);  /* shared: no PRIVATE flag */
}

static void futexWakeAll(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, 0x7fffffff, NULL, NULL, 0);
}

double fn_now(void) {
  struct timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* Every wait of `rank` sleeps on its own doorbell; ring it after changing what it may wait on. */
void fn_ring(fn_comm* comm, int rank) {
  uint32_t* bell = &comm->ctl->member[rank].doorbell;
  __atomic_fetch_add(bell, 1, __ATOMIC_SEQ_CST);
  futexWakeAll(bell);
}

/* ---- init and leave ------------------------------------------------------------------------ */

static void path(const fn_comm* comm, char* out, size_t size, const char* name) {
  snprintf(out, size, "%s/%s", comm->dir, name);
}

static int openOutbox(const fn_comm* comm, int rank, int flags) {
  char name[32], full[600];
  snprintf(name, sizeof(name), "out.%d", rank);
  path(comm, full, sizeof(full), name);
  return open(full, flags | O_CLOEXEC, 0600);
}

/* (a) of Note [Init protocol], after the bus id. */
static int mapControl(fn_comm* comm, const char id[128]) {
  char hex[2 * kTokenBytes + 1], full[600];
  for (int i = 0; i < kTokenBytes; ++i) {
    snprintf(hex + 2 * i, 3, "%02x", (unsigned char)id[sizeof(kMagic) + i]);
  }
  snprintf(comm->dir, sizeof(comm->dir), "%s/fakenccl-%s", baseDir(), hex);
  if (mkdir(comm->dir, 0700) != 0 && errno != EEXIST) return kNcclSystemError;
  const size_t n = (size_t)comm->nranks;
  comm->ctl_bytes = sizeof(fn_ctl) + n * sizeof(fn_member) + n * n * sizeof(uint32_t);
  path(comm, full, sizeof(full), "ctl");
  const int fd = open(full, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return kNcclSystemError;
  struct stat info;
  int ok = fstat(fd, &info) == 0 &&
           ((size_t)info.st_size >= comm->ctl_bytes || ftruncate(fd, (off_t)comm->ctl_bytes) == 0);
  void* map = ok ? mmap(NULL, comm->ctl_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : NULL;
  close(fd);
  if (map == NULL || map == MAP_FAILED) return kNcclSystemError;
  comm->ctl = map;
  comm->sent = (uint32_t*)(comm->ctl->member + n);
  uint32_t expected = 0;
  __atomic_compare_exchange_n(&comm->ctl->nranks, &expected, (uint32_t)n, 0, __ATOMIC_SEQ_CST,
                              __ATOMIC_SEQ_CST);
  return expected == 0 || expected == n ? kNcclSuccess : kNcclInvalidUsage;
}

/* NCCL 2.30+ with NCCL_MULTI_RANK_GPU_ENABLE set to a non-zero integer takes two ranks per GPU
 * (Note [Init protocol], e): this member's part, written into its table entry at (c). */
static int multiRankPerGpu(void) {
  const char* enabled = getenv("NCCL_MULTI_RANK_GPU_ENABLE");
  return fn_version() >= 23000 && enabled != NULL && atoi(enabled) != 0;
}

static int sameGpu(const fn_member* a, const fn_member* b) {
  return strcmp(a->host, b->host) == 0 && strcmp(a->bus_id, b->bus_id) == 0;
}

/* (b) and (c) of Note [Init protocol]. */
static int join(fn_comm* comm, const char* bus_id) {
  fn_member* me = &comm->ctl->member[comm->rank];
  uint32_t expected = 0;
  if (!__atomic_compare_exchange_n(&me->joined, &expected, 1, 0, __ATOMIC_SEQ_CST,
                                   __ATOMIC_SEQ_CST)) {
    fprintf(stderr, "fake-nccl: ncclCommInitRank: rank %d joined twice\n", comm->rank);
    return kNcclInvalidUsage;
  }
  comm->outbox_fd[comm->rank] = openOutbox(comm, comm->rank, O_RDWR | O_CREAT | O_TRUNC);
  if (comm->outbox_fd[comm->rank] < 0) {
    __atomic_store_n(&me->gone, 1, __ATOMIC_SEQ_CST);  /* claimed, but will never take part */
    return kNcclSystemError;
  }
  gethostname(me->host, sizeof(me->host) - 1);
  snprintf(me->bus_id, sizeof(me->bus_id), "%s", bus_id);
  me->pid = getpid();
  const char* fail = getenv("FAKE_NCCL_FAIL_INIT");
  me->fail_init = fail != NULL && strcmp(fail, "1") == 0;
  me->multi_rank = multiRankPerGpu();
  __atomic_fetch_add(&comm->ctl->joined, 1, __ATOMIC_SEQ_CST);  /* publishes the fields */
  futexWakeAll(&comm->ctl->joined);
  return kNcclSuccess;
}

/* (e) of Note [Init protocol], once every member joined. */
static int checkMembers(fn_comm* comm) {
  const fn_member* m = comm->ctl->member;
  for (int r = 0; r < comm->nranks; ++r) {
    if (m[r].fail_init) return r == comm->rank ? kNcclSystemError : kNcclRemoteError;
  }
  int multi_rank = 1;
  for (int r = 0; r < comm->nranks; ++r) multi_rank = multi_rank && m[r].multi_rank;
  if (multi_rank) {
    for (int i = 0; i < comm->nranks; ++i) {
      int sharing = 0;
      for (int j = 0; j < comm->nranks; ++j) sharing += sameGpu(&m[i], &m[j]);
      if (sharing <= 2) continue;
      fprintf(stderr, "%s:%d [fake-nccl] NCCL WARN %d ranks on CUDA device %s: at most 2 ranks "
              "per GPU are supported\n", m[comm->rank].host, (int)getpid(), sharing, m[i].bus_id);
      return kNcclInvalidUsage;
    }
    return kNcclSuccess;
  }
  for (int i = 0; i < comm->nranks; ++i) {
    for (int j = i + 1; j < comm->nranks; ++j) {
      if (!sameGpu(&m[i], &m[j])) continue;
      const int first = j == comm->rank ? j : i, second = j == comm->rank ? i : j;
      if (fn_version() >= 23000) {
        fprintf(stderr, "%s:%d [fake-nccl] NCCL WARN Multiple Ranks are using the same GPU: "
                "rank %d and rank %d on CUDA device %s (NCCL_MULTI_RANK_GPU_ENABLE=1 allows "
                "two)\n", m[comm->rank].host, (int)getpid(), first, second, m[i].bus_id);
      } else {
        fprintf(stderr, "%s:%d [fake-nccl] NCCL WARN Duplicate GPU detected : rank %d and rank "
                "%d both on CUDA device %s\n", m[comm->rank].host, (int)getpid(), first, second,
                m[i].bus_id);
      }
      return kNcclInvalidUsage;
    }
  }
  return kNcclSuccess;
}

/* FAKE_NCCL_INIT_STALL on this member: "hang" never joins (every member's set-up stays in
 * progress), "fail" never joins and fails (the others stay in progress): Note [Init states]. */
static int stallMode(void) {
  const char* mode = getenv("FAKE_NCCL_INIT_STALL");
  if (mode == NULL) return kNoStall;
  if (strcmp(mode, "hang") == 0) return kStallHang;
  return strcmp(mode, "fail") == 0 ? kStallFail : kNoStall;
}

/* (a)-(c) of Note [Init protocol]: the handle, in progress (Note [Init states]). */
int fn_comm_start(fn_comm** out, int nranks, const char id[128], int rank) {
  if (out == NULL || nranks < 1 || rank < 0 || rank >= nranks ||
      memcmp(id, kMagic, sizeof(kMagic)) != 0) {
    return kNcclInvalidArgument;
  }
  *out = NULL;
  int device = 0;
  char bus_id[sizeof(((fn_member*)NULL)->bus_id)] = {0};
  if (cudaGetDevice(&device) != 0 || cudaDeviceGetPCIBusId(bus_id, sizeof(bus_id), device) != 0) {
    return kNcclUnhandledCudaError;  /* (a): nothing created yet, nothing to clean */
  }
  fn_comm* comm = calloc(1, sizeof(*comm));
  int* fds = calloc((size_t)nranks, sizeof(int));
  uint32_t* seqs = calloc(2 * (size_t)nranks, sizeof(uint32_t));
  if (comm == NULL || fds == NULL || seqs == NULL) {
    free(comm);
    free(fds);
    free(seqs);
    return kNcclSystemError;
  }
  __atomic_fetch_add(&live_comms, 1, __ATOMIC_RELAXED);
  comm->rank = rank;
  comm->nranks = nranks;
  comm->timeout_s = fn_env_seconds("FAKE_NCCL_TIMEOUT_S", 300);
  comm->outbox_fd = fds;
  comm->send_seq = seqs;
  comm->recv_seq = seqs + nranks;
  comm->refs = 1;
  comm->init_state = kNcclInProgress;
  comm->stall = stallMode();
  for (int r = 0; r < nranks; ++r) fds[r] = -1;
  pthread_mutex_init(&comm->mu, NULL);
  pthread_cond_init(&comm->cv, NULL);
  int result = mapControl(comm, id);
  if (result == kNcclSuccess && comm->stall == kNoStall) result = join(comm, bus_id);
  if (comm->ctl != NULL && (result != kNcclSuccess || comm->stall != kNoStall)) {
    munmap(comm->ctl, comm->ctl_bytes);  /* never joined: the others don't count on it */
    comm->ctl = NULL;
  }
  if (result != kNcclSuccess) {
    fn_comm_release(comm);
    return result;
  }
  if (comm->stall == kStallFail) comm->init_state = kNcclSystemError;
  *out = comm;
  return kNcclSuccess;
}

/* (e) and (f) of Note [Init protocol] once every member joined; never waits. */
int fn_comm_poll_init(fn_comm* comm) {
  const int state = __atomic_load_n(&comm->init_state, __ATOMIC_SEQ_CST);
  if (state != kNcclInProgress || comm->stall != kNoStall) return state;
  if (__atomic_load_n(&comm->ctl->joined, __ATOMIC_SEQ_CST) < (uint32_t)comm->nranks) {
    return kNcclInProgress;
  }
  int result = checkMembers(comm);
  for (int r = 0; r < comm->nranks && result == kNcclSuccess; ++r) {
    if (r != comm->rank && (comm->outbox_fd[r] = openOutbox(comm, r, O_RDONLY)) < 0) {
      result = kNcclSystemError;
    }
  }
  __atomic_store_n(&comm->init_state, result, __ATOMIC_SEQ_CST);
  return result;
}

/* ncclCommInitRank: start, then (d) — sleep until every member joined or
 * FAKE_NCCL_INIT_TIMEOUT_S (default 60) passes — then finish. */
int fn_comm_init(fn_comm** out, int nranks, const char id[128], int rank) {
  fn_comm* comm = NULL;
  int result = fn_comm_start(&comm, nranks, id, rank);
  if (result != kNcclSuccess) return result;
  const double deadline = fn_now() + fn_env_seconds("FAKE_NCCL_INIT_TIMEOUT_S", 60);
  uint32_t joined = 0, word = 0;
  uint32_t* bell = comm->ctl != NULL ? &comm->ctl->joined : &word;  /* stalled: just sleeps */
  while ((result = fn_comm_poll_init(comm)) == kNcclInProgress) {
    const double left = deadline - fn_now();
    joined = __atomic_load_n(bell, __ATOMIC_SEQ_CST);
    if (left <= 0) {
      fprintf(stderr, "fake-nccl: ncclCommInitRank (rank %d): only %u of %d ranks joined "
              "within FAKE_NCCL_INIT_TIMEOUT_S\n", rank, joined, nranks);
      result = kNcclSystemError;
      break;
    }
    fn_futex_wait(bell, joined, left);
  }
  if (result != kNcclSuccess) {
    fn_comm_release(comm);
    return result;
  }
  *out = comm;
  return kNcclSuccess;
}

/* False once `pid` has exited, zombies included: a killed rank stays a zombie until its parent
 * (the test harness) reaps it, which may be after its peers leave. */
static int processRuns(pid_t pid) {
  if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
  char path[64], stat[512] = {0};
  snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
  FILE* file = fopen(path, "r");
  if (file == NULL) return 1;  /* no /proc: trust kill() */
  const size_t n = fread(stat, 1, sizeof(stat) - 1, file);
  fclose(file);
  const char* end = n > 0 ? strrchr(stat, ')') : NULL;  /* "pid (comm) S ..." */
  return end == NULL || (end[1] != '\0' && end[2] != 'Z' && end[2] != 'X');
}

/* A member that joined, has not left, and whose process still runs (pid 0: not written yet). */
static int stillThere(const fn_member* m) {
  if (!__atomic_load_n(&m->joined, __ATOMIC_SEQ_CST)) return 0;
  if (__atomic_load_n(&m->gone, __ATOMIC_SEQ_CST)) return 0;
  return m->pid == 0 || processRuns(m->pid);
}

/* Note [Cleanup]. */
void fn_comm_leave(fn_comm* comm) {
  int expected = 0;
  if (comm->ctl == NULL || !__atomic_compare_exchange_n(&comm->has_left, &expected, 1, 0,
                                                        __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
    return;
  }
  __atomic_store_n(&comm->ctl->member[comm->rank].gone, 1, __ATOMIC_SEQ_CST);
  for (int r = 0; r < comm->nranks; ++r) {
    if (r != comm->rank && stillThere(&comm->ctl->member[r])) return;
  }
  DIR* dir = opendir(comm->dir);
  struct dirent* entry;
  char full[900];
  while (dir != NULL && (entry = readdir(dir)) != NULL) {
    if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
    snprintf(full, sizeof(full), "%s/%s", comm->dir, entry->d_name);
    unlink(full);
  }
  if (dir != NULL) closedir(dir);
  rmdir(comm->dir);
}

void fn_comm_release(fn_comm* comm) {
  pthread_mutex_lock(&comm->mu);
  const int last = --comm->refs == 0;
  pthread_cond_broadcast(&comm->cv);
  pthread_mutex_unlock(&comm->mu);
  if (!last) return;
  for (int r = 0; r < comm->nranks; ++r) {
    if (comm->outbox_fd[r] >= 0) close(comm->outbox_fd[r]);
  }
  if (comm->ctl != NULL) {
    fn_comm_leave(comm);
    munmap(comm->ctl, comm->ctl_bytes);
  }
  pthread_mutex_destroy(&comm->mu);
  pthread_cond_destroy(&comm->cv);
  free(comm->outbox_fd);
  free(comm->send_seq);
  free(comm);
  __atomic_fetch_sub(&live_comms, 1, __ATOMIC_RELAXED);
}
