// CoreHeadroom (runtime/core_headroom.h).
//
// Note [Spin while a core is free]
// On a virtual machine a sleeping thread is expensive to wake: the waker's FUTEX_WAKE of a
// thread whose core is idle costs the waker 13-15 us (an inter-processor interrupt through
// the hypervisor) and the sleeper 50-65 us until it runs (measured on this 2-core VM with two
// pinned threads, 300 us apart). A pipeline stage's receive mostly waits for its neighbour's
// compute, 0.1-1 ms in a hand-off-bound step, longer than HVD_CALLER_SPIN_US's 200 us; each
// wait that outlived the spin paid both costs, on the critical path. MPI spins for as long as
// it waits. We spin longer only while that costs nobody a core:
//   A. A point-to-point wait whose spin budget ran out keeps driving, HVD_P2P_SPIN_MAX_US at
//      most from the drive's start, while coreFree(): the host's running and runnable
//      threads (the fourth field of /proc/loadavg, counted when read) are no more than the
//      CPUs the host's ranks may use. The spinner is one of them; a neighbour computing on
//      the other core is another; a third thread wanting a core ends the spin within a slice.
//   B. Only where the ranks are bound to their own CPUs (Note [CPU binding] in
//      cpu_binding.cc): unbound, two ranks may share one core while the host's count looks
//      fine, and the spin then holds the core its neighbour waits for (measured: with the
//      spin on and the ranks unbound, hand-off-bound pipeline steps of 17-20 ms with both
//      ranks on one core). Never where the host's ranks outnumber its cores (spins yield
//      there: Note [Yielding spins] in transport/mesh.cc; bound, they share CPUs: Note [CPU
//      binding] C), and never while Note [Spin backoff] has turned the spin off: waits
//      longer than the cap still miss and back off.
//   C. coreFree() is one pread of a small kernel file (~2 us), once per kHeadroomSlice of
//      spinning. The count is the whole machine's (a container sees its host's threads), so
//      a busy host reads as having no free core and the spin ends: the safe side. CPU quotas
//      (cgroup cpu.max) are not read: a quota'd container may lower HVD_P2P_SPIN_MAX_US. The
//      count is host-wide: with shares of several CPUs, one rank's share can be oversubscribed
//      (its own threads) while the host's count looks fine.
#include "runtime/core_headroom.h"

#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "common/test_switch.h"

namespace hvd::runtime {

// Test switch: HVD_TEST_CORE_FREE=1 (or 0) makes coreFree() answer true (false) whatever the
// host runs, so a test sees the spin's rule on a loaded host too.
CoreHeadroom::CoreHeadroom(int cores) : cores_(cores) {
  if (const char* forced = HVD_TEST_SWITCH("CORE_FREE")) forced_ = std::atoi(forced) != 0;
  // cores 0: the rank is not bound to CPUs of its own and never asks (Note [Spin while a core
  // is free] B)
  if (cores_ > 0) loadavg_fd_ = ::open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
}

CoreHeadroom::~CoreHeadroom() {
  if (loadavg_fd_ >= 0) ::close(loadavg_fd_);
}

bool CoreHeadroom::coreFree() const {
  if (forced_ >= 0) return forced_ == 1;
  if (loadavg_fd_ < 0 || cores_ <= 0) return false;
  char text[128];
  const ssize_t n = ::pread(loadavg_fd_, text, sizeof(text) - 1, 0);
  if (n <= 0) return false;
  text[n] = '\0';
  const long running = runningThreads(text);
  return running >= 0 && running <= cores_;
}

long runningThreads(const char* loadavg) {
  // "0.46 1.04 2.16 3/90 31139": the running count is the number before the '/'.
  const char* slash = std::strchr(loadavg, '/');
  if (slash == nullptr) return -1;
  const char* start = slash;
  while (start > loadavg && start[-1] >= '0' && start[-1] <= '9') --start;
  if (start == slash || slash - start > 9) return -1;
  return std::strtol(start, nullptr, 10);
}

}  // namespace hvd::runtime
