// The core's bounded spins (HVD_SPIN_US, HVD_CALLER_SPIN_US): cpuRelax() tells the CPU (and a
// hyper-thread sibling) that this thread is only waiting; spinPause() is one step of such a
// spin, which yields the core instead where ranks outnumber the cores (Note [Yielding spins] in
// transport/mesh.cc). Any thread.
#pragma once

#include <sched.h>
#include <unistd.h>

#include "common/cpu_ranges.h"

namespace hvd::common {

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

inline void spinPause(bool yield) {
  if (yield) {
    sched_yield();
    return;
  }
  for (int k = 0; k < 32; ++k) cpuRelax();
}

// The CPUs this process could run on when the core first asked: its affinity mask before the
// core bound it to a share of them (Note [CPU binding] in runtime/cpu_binding.cc), so a
// re-initialised core sees the host's CPUs, not its own earlier share. Empty if unreadable.
// Tests may name CPUs this machine lacks (HVD_TEST_CPU_MASK, a CPU list): binding to them then
// fails, and the warning names the share (tests/multiproc/test_cpu_binding.py).
inline const cpu_set_t& processCpuMask() {
  static const cpu_set_t mask = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (testCpuMask(&set)) return set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0) CPU_ZERO(&set);
    return set;
  }();
  return mask;
}

// The machine's online CPUs, whatever this process may run on.
inline int onlineCpus() {
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<int>(online) : 1;
}

// The cores this process may run on (processCpuMask()), or the online count.
inline int usableCores() {
  const int n = CPU_COUNT(&processCpuMask());
  return n > 0 ? n : onlineCpus();
}

}  // namespace hvd::common
