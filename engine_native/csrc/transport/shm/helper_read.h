// HelperRead: a range of a peer's memory read into this process by a thread of its own, while
// the thread that asked reads another range of the same message (Note [Split copy] G in
// transport/peer_split.cc): two cores copy a message into memory that only this process writes.
// One reading thread per process, started at the first read (a forked child starts its own,
// and the parent's reads end failed there: Note [Helper reads across fork] in helper_read.cc);
// its reads run one after another, in the order asked. Any thread.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "common/cpu_relax.h"
#include "common/status.h"

namespace hvd::transport::shm {

struct HelperRead {
  pid_t pid = 0;
  uint64_t remote = 0;     // the peer's address
  uint8_t* local = nullptr;
  size_t bytes = 0;
  // Called on the reading thread once `finished` is set (a wake for whoever waits for it),
  // never after awaitHelperRead on this read has returned.
  void (*on_finished)(void* context) = nullptr;
  void* context = nullptr;
  std::atomic<bool> finished{false};  // seq_cst; `status` is final once it is set
  common::Status status;
  int os_error = 0;  // errno of a failed read (ESRCH: the peer is gone), else 0
  bool released = false;  // under the reader's lock: the reading thread is done with it
};

// Queues `read`; `local` and the callback's context must stay valid until awaitHelperRead
// returns for it.
void startHelperRead(std::shared_ptr<HelperRead> read);
// Blocks until the reading thread is done with `read` (writes nothing more to `local`, calls
// nothing more). Bounded: process_vm_readv of a stopped process reads it, of an exited one fails.
void awaitHelperRead(const HelperRead& read);

// Reads `bytes` of `pid`'s memory at `remote` into `local` on two threads: the second half
// (from a page boundary) by the reading thread, the first by the calling thread; returns once
// both are done, with the first failure. One thread's process_vm_readv is bound by the
// kernel's work per page more than by memory, so where another core is idle two threads read
// a message in about half the time (Note [Two-thread reads] in algo/broadcast_shm.cc).
common::Status readOnTwoThreads(pid_t pid, uint64_t remote, void* local, size_t bytes);

// Whether a reader of a host's broadcast reads on two threads (Note [Two-thread reads] in
// algo/broadcast_shm.cc): the host has two CPUs per reader (2 x (host_ranks - 1) <= the CPUs
// this process could use before any binding), its ranks do not outnumber its cores, and the
// reader runs on `own_cpus` >= 2 of them. Asked at setup with the CPUs the rank will run on
// (the host agrees on single-copy broadcasts from every rank's answer: HVD_SINGLE_COPY=auto),
// and by each read with the thread's mask then.
inline bool readsOnTwoThreads(int host_ranks, bool cores_outnumbered, int own_cpus) {
  return host_ranks >= 2 && !cores_outnumbered && own_cpus >= 2 &&
         2 * (host_ranks - 1) <= common::usableCores();
}

// Reads the reading thread has run since the process started (metrics()["helper_reads"]).
uint64_t helperReads();

}  // namespace hvd::transport::shm
