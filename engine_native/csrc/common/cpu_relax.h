// The core's bounded spins (HVD_SPIN_US, HVD_CALLER_SPIN_US): cpuRelax() tells the CPU (and a
// hyper-thread sibling) that this thread is only waiting; spinPause() is one step of such a
// spin, which yields the core instead where ranks outnumber the cores (Note [Yielding spins] in
// transport/mesh.cc). Any thread.
#pragma once

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <utility>
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
// `fallback_cpus`. Union-find over (CPU, rank) pairs: O(T log T) in the T numbers given.
inline bool groupOutnumbersItsCpus(const std::vector<std::vector<int>>& cpus, size_t self,
                                   int fallback_cpus) {
  if (self >= cpus.size()) return false;
  std::vector<std::pair<int, size_t>> pairs;  // (cpu, rank)
  for (size_t r = 0; r < cpus.size(); ++r) {
    if (cpus[r].empty()) return static_cast<int>(cpus.size()) > fallback_cpus;
    for (int cpu : cpus[r]) pairs.emplace_back(cpu, r);
  }
  std::sort(pairs.begin(), pairs.end());
  std::vector<size_t> parent(cpus.size());
  for (size_t r = 0; r < parent.size(); ++r) parent[r] = r;
  auto root = [&parent](size_t r) {
    while (parent[r] != r) r = parent[r] = parent[parent[r]];
    return r;
  };
  for (size_t k = 1; k < pairs.size(); ++k) {  // ranks listing the same CPU join one group
    if (pairs[k].first == pairs[k - 1].first) {
      parent[root(pairs[k].second)] = root(pairs[k - 1].second);
    }
  }
  const size_t group = root(self);
  size_t ranks = 0, group_cpus = 0;
  for (size_t r = 0; r < cpus.size(); ++r) ranks += root(r) == group;
  for (size_t k = 0; k < pairs.size(); ++k) {  // each CPU of the group once
    const bool first = k == 0 || pairs[k].first != pairs[k - 1].first;
    group_cpus += first && root(pairs[k].second) == group;
  }
  return ranks > group_cpus;
}

}  // namespace hvd::common
