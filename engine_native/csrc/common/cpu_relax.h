// The core's bounded spins (HVD_SPIN_US, HVD_CALLER_SPIN_US): cpuRelax() tells the CPU (and a
// hyper-thread sibling) that this thread is only waiting; spinPause() is one step of such a
// spin, which yields the core instead where ranks outnumber the cores (Note [Yielding spins] in
// transport/mesh.cc). Any thread.
#pragma once

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <iterator>
#include <vector>

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
inline const cpu_set_t& processCpuMask() {
  static const cpu_set_t mask = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof(set), &set) != 0) CPU_ZERO(&set);
    return set;
  }();
  return mask;
}

// The CPUs of processCpuMask(), ascending.
inline std::vector<int> processCpus() {
  std::vector<int> cpus;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (CPU_ISSET(cpu, &processCpuMask())) cpus.push_back(cpu);
  }
  return cpus;
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

// Note [Yielding spins] B in transport/mesh.cc: whether rank `self` and the ranks whose CPUs
// overlap its own, directly or through one another's, outnumber the CPUs of that group.
// `cpus[r]`: rank r's CPUs, any order; where one is empty (unknown), every rank counts against
// `fallback_cpus`.
inline bool groupOutnumbersItsCpus(std::vector<std::vector<int>> cpus, size_t self,
                                   int fallback_cpus) {
  for (std::vector<int>& c : cpus) {
    if (c.empty()) return static_cast<int>(cpus.size()) > fallback_cpus;
    std::sort(c.begin(), c.end());
    c.erase(std::unique(c.begin(), c.end()), c.end());
  }
  std::vector<char> member(cpus.size(), 0);
  member[self] = 1;
  std::vector<int> group = cpus[self];
  size_t ranks = 1;
  for (bool grew = true; grew;) {
    grew = false;
    for (size_t r = 0; r < cpus.size(); ++r) {
      if (member[r] != 0) continue;
      std::vector<int> shared;
      std::set_intersection(group.begin(), group.end(), cpus[r].begin(), cpus[r].end(),
                            std::back_inserter(shared));
      if (shared.empty()) continue;
      member[r] = 1;
      ++ranks;
      grew = true;
      std::vector<int> merged;
      std::set_union(group.begin(), group.end(), cpus[r].begin(), cpus[r].end(),
                     std::back_inserter(merged));
      group.swap(merged);
    }
  }
  return ranks > group.size();
}

}  // namespace hvd::common
