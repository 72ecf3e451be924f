/* fake_cudart_ipc.c: CUDA IPC of the fake runtime — device memory and events that a peer
 * process opens from a 64-byte handle, as cudaIpc{Get,Open,Close}MemHandle and
 * cudaIpc{Get,Open}EventHandle do on one GPU. Test-only; Linux (memfd, /proc, futex).
 *
 * Note [IPC memory]: every cudaMalloc is a MAP_SHARED mapping of its own memfd. A handle names
 * the exporter's pid, that fd and the memfd's inode; the peer opens /proc/<pid>/fd/<fd>, checks
 * the inode (the fd number may have been reused by a later allocation) and maps the pages at an
 * address of its own. Errors as CUDA's: your own handle -> cudaErrorDeviceUninitialized
 * ("invalid device context"); a freed allocation or a dead exporter -> cudaErrorInvalidResource-
 * Handle. A mapping outlives its exporter (the pages stay while mapped), as CUDA keeps an
 * allocation alive while a peer holds it open. Opening one handle twice returns the same
 * address, counted; cudaIpcCloseMemHandle waits for every stream (queued work may read the
 * mapping) and unmaps at the last close. fakeCudaLiveIpcMappings() counts open mappings.
 * An open mapping holds a shared flock on its own open of the memfd, so the exporter's cudaFree
 * sees a peer that still maps the allocation (CUDA: undefined behaviour) and counts it in
 * fakeCudaFreedWhileMapped() (fc_freed_while_mapped).
 *
 * Note [IPC events]: an interprocess event keeps two counters in a shared page: `recorded`
 * (bumped by cudaEventRecord on the host, at the call) and `fired` (set by the record's op when
 * its stream reaches it). cudaStreamWaitEvent captures `recorded` at the call and queues an op
 * that sleeps (futex, never spinning) until `fired` reaches it — so, as in CUDA, a wait is for
 * the latest record *at the call*, and a wait on an event its exporter has not recorded yet
 * for this round waits for nothing new. A dead exporter's event never fires again. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fake_cudart.h"

#define HANDLE_MAGIC_MEMORY 0x4d435046u /* "FPCM" */
#define HANDLE_MAGIC_EVENT 0x45435046u  /* "FPCE" */
#define PAGE 4096

/* cudaIpcMemHandle_t / cudaIpcEventHandle_t: 64 opaque bytes, passed by value. */
typedef struct {
  uint32_t magic;
  int32_t pid;
  int32_t fd;
  uint32_t unused;
  uint64_t inode;
  uint64_t bytes;
  char pad[32];
} fc_ipc_handle;
_Static_assert(sizeof(fc_ipc_handle) == 64, "CUDA IPC handles are 64 bytes");

/* ---- memory --------------------------------------------------------------------------------- */

void* fc_shared_map(size_t bytes, int* fd) {
  *fd = memfd_create("fakecuda", MFD_CLOEXEC);
  if (*fd < 0) return NULL;
  if (ftruncate(*fd, (off_t)bytes) != 0) {
    close(*fd);
    return NULL;
  }
  void* p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *fd, 0);
  if (p == MAP_FAILED) {
    close(*fd);
    return NULL;
  }
  return p;
}

void fc_shared_unmap(void* pointer, size_t bytes, int fd) {
  munmap(pointer, bytes);
  close(fd);
}

typedef struct fc_mapping fc_mapping;
struct fc_mapping {
  fc_mapping* next;
  void* ptr;
  size_t bytes;
  int32_t pid;
  uint64_t inode;
  int opens;
  int fd;  /* our own open of the exporter's memfd, flock(LOCK_SH)'d while mapped */
};

static pthread_mutex_t mappings_mu = PTHREAD_MUTEX_INITIALIZER;
static fc_mapping* mappings;

static uint64_t inodeOf(int fd) {
  struct stat st;
  return fstat(fd, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* The peer's fd, opened through /proc; -1 when the process or the allocation is gone. */
static int openPeerFd(const fc_ipc_handle* h) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/fd/%d", (int)h->pid, (int)h->fd);
  int fd = open(path, O_RDWR | O_CLOEXEC);
  if (fd >= 0 && inodeOf(fd) != h->inode) {
    close(fd);
    return -1;
  }
  return fd;
}

FC_API int cudaIpcGetMemHandle(fc_ipc_handle* handle, void* device_pointer) {
  fc_count(FC_CALL_cudaIpcGetMemHandle);
  void* base = NULL;
  size_t bytes = 0;
  int fd = -1;
  if (handle == NULL || !fc_device_allocation(device_pointer, &base, &bytes, &fd)) {
    return kCudaErrorInvalidValue;
  }
  memset(handle, 0, sizeof(*handle));
  handle->magic = HANDLE_MAGIC_MEMORY;
  handle->pid = (int32_t)getpid();
  handle->fd = fd;
  handle->inode = inodeOf(fd);
  handle->bytes = bytes;
  return kCudaSuccess;
}

int fc_ipc_mapping_range(const void* pointer, void** base, size_t* bytes) {
  const char* p = pointer;
  int found = 0;
  pthread_mutex_lock(&mappings_mu);
  for (fc_mapping* m = mappings; m != NULL && !found; m = m->next) {
    if (p >= (const char*)m->ptr && p < (const char*)m->ptr + m->bytes) {
      *base = m->ptr;
      *bytes = m->bytes;
      found = 1;
    }
  }
  pthread_mutex_unlock(&mappings_mu);
  return found;
}

/* flags: cudaIpcMemLazyEnablePeerAccess (1) or 0. */
FC_API int cudaIpcOpenMemHandle(void** device_pointer, fc_ipc_handle handle, unsigned flags) {
  fc_count(FC_CALL_cudaIpcOpenMemHandle);
  if (device_pointer == NULL || flags > 1 || handle.magic != HANDLE_MAGIC_MEMORY) {
    return kCudaErrorInvalidValue;
  }
  if (handle.pid == (int32_t)getpid()) return kCudaErrorDeviceUninitialized;
  pthread_mutex_lock(&mappings_mu);
  for (fc_mapping* m = mappings; m != NULL; m = m->next) {
    if (m->pid == handle.pid && m->inode == handle.inode) {
      m->opens++;
      *device_pointer = m->ptr;
      pthread_mutex_unlock(&mappings_mu);
      return kCudaSuccess;
    }
  }
  pthread_mutex_unlock(&mappings_mu);
  const int fd = openPeerFd(&handle);
  if (fd < 0) return kCudaErrorInvalidResourceHandle;
  void* p = mmap(NULL, handle.bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  fc_mapping* m = p != MAP_FAILED ? calloc(1, sizeof(*m)) : NULL;
  if (m == NULL || flock(fd, LOCK_SH) != 0) {
    if (p != MAP_FAILED) munmap(p, handle.bytes);
    free(m);
    close(fd);
    return kCudaErrorMapBufferObjectFailed;
  }
  *m = (fc_mapping){NULL, p, handle.bytes, handle.pid, handle.inode, 1, fd};
  pthread_mutex_lock(&mappings_mu);
  m->next = mappings;
  mappings = m;
  pthread_mutex_unlock(&mappings_mu);
  *device_pointer = p;
  return kCudaSuccess;
}

FC_API int cudaIpcCloseMemHandle(void* device_pointer) {
  fc_count(FC_CALL_cudaIpcCloseMemHandle);
  fc_drain_all();  /* queued work may still read the mapping */
  pthread_mutex_lock(&mappings_mu);
  fc_mapping** p = &mappings;
  while (*p != NULL && (*p)->ptr != device_pointer) p = &(*p)->next;
  fc_mapping* found = *p;
  if (found != NULL && --found->opens == 0) {
    *p = found->next;
  } else {
    found = found != NULL ? NULL : (fc_mapping*)-1;  /* still open elsewhere / unknown */
  }
  pthread_mutex_unlock(&mappings_mu);
  if (found == (fc_mapping*)-1) return kCudaErrorInvalidValue;
  if (found != NULL) {
    munmap(found->ptr, found->bytes);
    close(found->fd);  /* drops the flock: the exporter may free now */
    free(found);
  }
  return kCudaSuccess;
}

static long freed_while_mapped;

void fc_note_free_of_shared(int fd) {
  if (flock(fd, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    __atomic_add_fetch(&freed_while_mapped, 1, __ATOMIC_RELAXED);
  }
}

FC_API long fakeCudaFreedWhileMapped(void) {
  return __atomic_load_n(&freed_while_mapped, __ATOMIC_RELAXED);
}

FC_API long fakeCudaLiveIpcMappings(void) {
  long n = 0;
  pthread_mutex_lock(&mappings_mu);
  for (fc_mapping* m = mappings; m != NULL; m = m->next) n++;
  pthread_mutex_unlock(&mappings_mu);
  return n;
}

/* ---- events --------------------------------------------------------------------------------- */

typedef struct {
  uint32_t recorded;
  uint32_t fired;
} fc_event_page;

struct fc_shared_event {
  fc_event_page* page;
  int fd;    /* the memfd (exporter) or -1 (opened from a handle) */
  int refs;  /* the event + queued ops; under fc_mu */
};

static fc_shared_event* sharedEventOf(fc_event_page* page, int fd) {
  fc_shared_event* shared = calloc(1, sizeof(*shared));
  if (shared == NULL) return NULL;
  shared->page = page;
  shared->fd = fd;
  shared->refs = 1;
  return shared;
}

fc_shared_event* fc_shared_event_new(void) {
  int fd = -1;
  fc_event_page* page = fc_shared_map(PAGE, &fd);
  if (page == NULL) return NULL;
  fc_shared_event* shared = sharedEventOf(page, fd);
  if (shared == NULL) fc_shared_unmap(page, PAGE, fd);
  return shared;
}

static void releaseLocked(fc_shared_event* shared) {
  if (--shared->refs > 0) return;
  if (shared->fd >= 0) {
    fc_shared_unmap(shared->page, PAGE, shared->fd);
  } else {
    munmap(shared->page, PAGE);
  }
  free(shared);
}

void fc_shared_event_free(fc_shared_event* shared) { releaseLocked(shared); }

static long futex(uint32_t* word, int op, uint32_t value, const struct timespec* timeout) {
  return syscall(SYS_futex, word, op, value, timeout, NULL, 0);
}

static int reached(uint32_t fired, uint32_t target) { return (int32_t)(fired - target) >= 0; }

static void runSharedRecord(fc_op* op) {
  fc_shared_event* shared = op->arg;
  uint32_t* fired = &shared->page->fired;
  const uint32_t seq = (uint32_t)op->bytes;
  uint32_t now = __atomic_load_n(fired, __ATOMIC_ACQUIRE);
  while (!reached(now, seq) &&
         !__atomic_compare_exchange_n(fired, &now, seq, 0, __ATOMIC_RELEASE, __ATOMIC_ACQUIRE)) {
  }
  futex(fired, FUTEX_WAKE, INT_MAX, NULL);  /* shared futex: wakes the peers' streams too */
  pthread_mutex_lock(&fc_mu);
  releaseLocked(shared);
  pthread_mutex_unlock(&fc_mu);
}

static void runSharedWait(fc_op* op) {
  fc_shared_event* shared = op->arg;
  uint32_t* fired = &shared->page->fired;
  const uint32_t target = (uint32_t)op->bytes;
  const struct timespec tick = {0, 100 * 1000 * 1000};  /* re-checks; never spins */
  for (uint32_t now; !reached(now = __atomic_load_n(fired, __ATOMIC_ACQUIRE), target);) {
    fakeCudaWorkerParks(1);
    futex(fired, FUTEX_WAIT, now, &tick);
    fakeCudaWorkerParks(0);
  }
  pthread_mutex_lock(&fc_mu);
  releaseLocked(shared);
  pthread_mutex_unlock(&fc_mu);
}

static int queueShared(fc_shared_event* shared, void* stream, void (*run)(fc_op*),
                       uint32_t seq) {
  fc_op* op = fc_op_new(run);
  if (op == NULL) return kCudaErrorMemoryAllocation;
  op->arg = shared;
  op->bytes = seq;
  shared->refs++;
  const int result = fc_enqueue_locked(stream, op);
  if (result != kCudaSuccess) shared->refs--;
  return result;
}

int fc_shared_event_record_locked(fc_shared_event* shared, void* stream) {
  const int ok = fc_check_stream_locked(stream);
  if (ok != kCudaSuccess) return ok;
  const uint32_t seq = __atomic_add_fetch(&shared->page->recorded, 1, __ATOMIC_ACQ_REL);
  return queueShared(shared, stream, runSharedRecord, seq);
}

static long ipc_event_waits;

/* cudaStreamWaitEvent calls on interprocess events, whether or not they had to wait: the
 * host-ordered IPC protocol makes none. */
FC_API long fakeCudaIpcEventWaits(void) {
  return __atomic_load_n(&ipc_event_waits, __ATOMIC_RELAXED);
}

int fc_shared_event_wait_locked(fc_shared_event* shared, void* stream) {
  __atomic_add_fetch(&ipc_event_waits, 1, __ATOMIC_RELAXED);
  const uint32_t target = __atomic_load_n(&shared->page->recorded, __ATOMIC_ACQUIRE);
  if (reached(__atomic_load_n(&shared->page->fired, __ATOMIC_ACQUIRE), target)) {
    return fc_check_stream_locked(stream);  /* nothing left to wait for */
  }
  return queueShared(shared, stream, runSharedWait, target);
}

int fc_shared_event_done(const fc_shared_event* shared) {
  return reached(__atomic_load_n(&shared->page->fired, __ATOMIC_ACQUIRE),
                 __atomic_load_n(&shared->page->recorded, __ATOMIC_ACQUIRE));
}

FC_API int cudaIpcGetEventHandle(fc_ipc_handle* handle, void* event) {
  fc_count(FC_CALL_cudaIpcGetEventHandle);
  if (handle == NULL) return kCudaErrorInvalidValue;
  pthread_mutex_lock(&fc_mu);
  const fc_shared_event* shared = fc_event_shared_locked(event);
  const int fd = shared != NULL ? shared->fd : -1;
  pthread_mutex_unlock(&fc_mu);
  if (fd < 0) return kCudaErrorInvalidResourceHandle;  /* not cudaEventInterprocess, or opened */
  memset(handle, 0, sizeof(*handle));
  handle->magic = HANDLE_MAGIC_EVENT;
  handle->pid = (int32_t)getpid();
  handle->fd = fd;
  handle->inode = inodeOf(fd);
  handle->bytes = PAGE;
  return kCudaSuccess;
}

FC_API int cudaIpcOpenEventHandle(void** event, fc_ipc_handle handle) {
  fc_count(FC_CALL_cudaIpcOpenEventHandle);
  if (event == NULL || handle.magic != HANDLE_MAGIC_EVENT) return kCudaErrorInvalidValue;
  if (handle.pid == (int32_t)getpid()) return kCudaErrorDeviceUninitialized;
  const int fd = openPeerFd(&handle);
  if (fd < 0) return kCudaErrorInvalidResourceHandle;
  void* page = mmap(NULL, PAGE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (page == MAP_FAILED) return kCudaErrorMapBufferObjectFailed;
  fc_shared_event* shared = sharedEventOf(page, -1);
  if (shared == NULL) {
    munmap(page, PAGE);
    return kCudaErrorMemoryAllocation;
  }
  const int result = fc_event_adopt(event, shared);
  if (result != kCudaSuccess) fc_shared_event_free(shared);
  return result;
}
