// Rank CPU binding (runtime/cpu_binding.h).
//
// Note [CPU binding]
// Unbound, the scheduler may put two ranks of a host on one core while another stays busy
// with a third process: a waker pulls the thread it wakes onto its own core when the sleeper's
// previous core is taken (wake_affine), and ranks that hand messages back and forth keep it
// that way. A hand-off-bound pipeline step (np=2, 2 cores, another process on the machine)
// then ran at 10-21 ms with both ranks on one core in every slow launch (sched_getcpu per
// action), against 5.5 ms apart. MPI implementations bind ranks for this reason; Horovod's
// launcher passes -bind-to none, so binding is asked for here (HVD_CPU_BIND=core, hvdrun
// --bind-to core), not imposed:
//   A. A rank's share is its local index's slice of the CPUs the process may use, split into
//      local-size contiguous runs (where that does not divide, the first CPUs mod local-size
//      runs get one more): the launchers' OMP_NUM_THREADS (CPUs / ranks) assumes that share.
//   B. Every thread the process has when the core initialises is bound (the loop thread does
//      not exist yet; threads created later inherit their creator's mask): the listing of
//      /proc/self/task, one sched_setaffinity per thread.
//   C. Where the host's ranks outnumber its CPUs, nothing is bound: a share would be empty.
//   D. Bound ranks cannot share a core, so a point-to-point wait may spin on while the host
//      has a core free (Note [Spin while a core is free] in core_headroom.cc); unbound, that
//      spin could hold the very core its neighbour waits for.
//   E. A re-initialised core (an elastic reset: another local index, perhaps another local
//      size) splits the process's mask from its first initialisation, not its own binding;
//      HVD_CPU_BIND=none then undoes a binding it made.
#include "runtime/cpu_binding.h"

#include <dirent.h>
#include <errno.h>
#include <sched.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace hvd::runtime {

namespace {

// E: the process's mask when the core first initialised, before any binding of its own.
const cpu_set_t& originalMask() {
  static const cpu_set_t mask = [] {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (::sched_getaffinity(0, sizeof(set), &set) != 0) CPU_ZERO(&set);
    return set;
  }();
  return mask;
}

std::vector<int> allowedCpus() {
  std::vector<int> cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &originalMask())) cpus.push_back(c);
  }
  return cpus;
}

bool bound_by_us = false;  // Runtime::init only, under its mutex

// B: every thread of this process; 0, or the errno of a thread that could not be bound.
int bindAllThreads(const cpu_set_t& set) {
  DIR* dir = ::opendir("/proc/self/task");
  if (dir == nullptr) return ::sched_setaffinity(0, sizeof(set), &set) == 0 ? 0 : errno;
  int failure = 0;
  while (const dirent* entry = ::readdir(dir)) {
    const long tid = std::strtol(entry->d_name, nullptr, 10);
    // (a thread that ended since the listing is no failure)
    if (tid > 0 && ::sched_setaffinity(static_cast<pid_t>(tid), sizeof(set), &set) != 0 &&
        errno != ESRCH && failure == 0) {
      failure = errno;
    }
  }
  ::closedir(dir);
  return failure;
}

}  // namespace

common::Status bindRank(const std::string& mode, int local_index, int local_size,
                        CpuBinding* out, std::string* why) {
  const std::vector<int> cpus = allowedCpus();
  *out = CpuBinding{};
  out->host_cores = static_cast<int>(cpus.size());
  if (mode == "none" || mode.empty()) {
    if (bound_by_us && bindAllThreads(originalMask()) == 0) bound_by_us = false;  // E
    return common::Status::ok();
  }
  if (mode != "core") {
    return common::invalidArgument("HVD_CPU_BIND=" + mode + ": expected none or core");
  }
  const int n = static_cast<int>(cpus.size());
  if (local_size <= 0 || local_index < 0 || local_index >= local_size) {
    return common::invalidArgument("HVD_CPU_BIND=core: no local rank to bind");
  }
  if (local_size > n) {  // C
    *why = std::to_string(local_size) + " ranks on this host, " + std::to_string(n) +
           " CPUs: not bound";
    return common::Status::ok();
  }
  // A: shares of n / local_size, the first n % local_size of them one CPU larger.
  const int base = n / local_size;
  const int extra = n % local_size;
  const int first = local_index * base + std::min(local_index, extra);
  const int count = base + (local_index < extra ? 1 : 0);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int k = first; k < first + count; ++k) {
    CPU_SET(cpus[static_cast<size_t>(k)], &set);
    out->cpus += (out->cpus.empty() ? "" : ",") + std::to_string(cpus[static_cast<size_t>(k)]);
  }
  if (const int failure = bindAllThreads(set)) {
    const std::string reason = std::strerror(failure);
    bindAllThreads(originalMask());  // no thread is left bound alone
    return common::internalError("HVD_CPU_BIND=core: could not bind this process's threads "
                                 "to CPUs " + out->cpus + " (" + reason + "); a cgroup "
                                 "cpuset may forbid them: unset HVD_CPU_BIND");
  }
  out->bound = bound_by_us = true;
  return common::Status::ok();
}

}  // namespace hvd::runtime
