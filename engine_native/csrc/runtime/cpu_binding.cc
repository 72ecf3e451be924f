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
// --bind-to core), not imposed, but where the ranks outnumber the CPUs evenly (I):
//   A. A rank's share is its local index's slice of the CPUs the process may use, split into
//      local-size contiguous runs (where that does not divide, the first CPUs mod local-size
//      runs get one more): the launchers' OMP_NUM_THREADS (CPUs / ranks) assumes that share.
//   B. Every thread the process has when the core initialises is bound (the loop thread does
//      not exist yet; threads created later inherit their creator's mask): the listing of
//      /proc/self/task, one sched_setaffinity per thread.
//   C. Where the host's ranks outnumber its CPUs, each rank is bound to one CPU, the ranks in
//      contiguous runs of local-size / CPUs (where that does not divide, the first CPUs
//      local-size mod CPUs take one rank more, as A's shares take one CPU more): the ranks
//      share the CPUs anyway, and unbound, the scheduler placed them unevenly and kept them
//      so. np=4 on this 2-vCPU VM, unbound: small ops moved between 13-17 us (two ranks on
//      each CPU), 20-60 us (three on one CPU, for up to six blocks of 200 ops) and 75-100
//      us; bound two to a CPU, 13-15 us in every block of four launches, and the
//      embedding-heavy step 5.7-7.3 against 10.3-10.6 ms (benchmarks/RESULTS.md, "np=4 on 2
//      cores bound"). Only where the machine's ranks crowd these CPUs (Mesh::cpusCrowded(),
//      from every rank's CPU set): a launcher that narrowed each rank's mask (mpirun
//      --bind-to socket, taskset) leaves fewer CPUs than the host's ranks in every mask, and
//      where the masks do not crowd one another those ranks stay unbound, with a warning.
//      Fake hosts or containers on one machine (their ranks' CPUs overlap and outnumber the
//      CPUs they span: Note [Yielding spins] B in transport/mesh.cc) split their CPUs each
//      alone, so their shares coincide: hosts AABB on 2 CPUs put A0 and B0 on the first CPU,
//      A1 and B1 on the second. Below that, two such hosts' shares still overlap (hosts AABB
//      on 4 CPUs: A's and B's first ranks both on CPUs 0-1). Wherever ranks share CPUs their
//      spins yield (Mesh::spinYields()).
//   D. Ranks bound to CPUs of their own share none, so a point-to-point wait may spin on while
//      the host has a core free (Note [Spin while a core is free] in core_headroom.cc);
//      unbound, or bound to CPUs that others share (where spins yield), that spin could hold
//      the very core its neighbour waits for.
//   E. The CPUs split are the process's mask when the core first asked (common::
//      processCpuMask), not its own later binding: a re-initialised core (an elastic reset,
//      another local index or size) first undoes its earlier binding, then splits again, and
//      HVD_CPU_BIND=none leaves the process unbound. A user's own sched_setaffinity between
//      two inits is not seen.
//   F. The CPUs are ordered by (package, core) from sysfs before they are split, so the
//      hardware threads of one core (often numbered i and i + CPUs/2) fall in one share:
//      whole cores per rank where the ranks are no more than the cores.
//   G. One rank on the host: nothing to split, nothing bound.
//   H. Binding is a speed-up, never needed for correctness: a failure (a cgroup cpuset that
//      forbids the share) restores the mask and the rank runs unbound, with a warning.
//   I. The default, HVD_CPU_BIND=auto, binds only C's case, and only where the host's ranks
//      outnumber its CPUs by a whole multiple (4 or 6 on 2, 8 on 4): there the ranks share
//      every CPU anyway, and unbound the scheduler's placement cost up to 1.5-3x (np=4 on
//      this 2-vCPU VM: small ops, the embedding step, 1 MiB allreduce medians 247-776 against
//      252-263 us bound; benchmarks/RESULTS.md, "np=4 on 2 cores, bound by default" and "np=4
//      on 2 cores bound"). A whole multiple keeps two such jobs
//      on one machine even between them (4 + 6 ranks on 2 CPUs: 5 on each), where an uneven
//      share (3 on 2: two on the first CPU) would stack their remainders on the same CPUs;
//      those stay unbound, as do ranks no more than the CPUs, where the scheduler's choice
//      leaves room for the machine's other processes. Only where no other rank of the host may run
//      on the group's CPUs without being in the group (J): groups that share some CPUs would stack
//      their shares on them. (Ranks of other hosts on the same machine, fake hosts or containers,
//      are not looked at.) Fake hosts on one machine (hosts AABB on 2 CPUs: two ranks per host) are
//      not outnumbered per host and stay unbound. It says nothing where it does not bind, and a
//      refused binding is logged at info, not warned.
//   J. Groups. A and C split a process's CPUs among the ranks of its host that may run on
//      exactly those CPUs (its group, by the peer table's masks), by the rank's place among
//      them, where no other rank of the host may run on any of them: masks a launcher set per
//      socket (ranks 0-3 on CPUs 0-1, 4-7 on 2-3) bind ranks 0-3 two to a CPU on 0-1 and 4-7
//      on 2-3, and with 4 CPUs a socket (not crowded) one CPU each. Split by the index among
//      all of the host's ranks, as before 2026-12-07, ranks 0-3 all landed on CPU 0, and
//      ranks on 4-CPU sockets were refused as if pinned apart. Where masks overlap without
//      being the same, the split is still the host's, by index (a balance across overlapping
//      masks would need a matching of ranks to CPUs). A rank alone in its group keeps its
//      mask (nothing to split).
// The binding outlives shutdown() (a notebook engine stays on its share until the next init
// or the process ends), and it replaces OpenMP's own per-thread pinning (KMP_AFFINITY,
// GOMP_CPU_AFFINITY) of threads that exist at init.
#include "runtime/cpu_binding.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "common/cpu_relax.h"

namespace hvd::runtime {

namespace {

// (POSIX reads: the core links no iostreams, tests/unit/test_core_without_iostreams.py)
long topologyValue(int cpu, const char* name, long fallback) {
  const std::string path =
      "/sys/devices/system/cpu/cpu" + std::to_string(cpu) + "/topology/" + name;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fallback;
  char text[32];
  const ssize_t n = ::read(fd, text, sizeof(text) - 1);
  ::close(fd);
  if (n <= 0) return fallback;
  text[n] = '\0';
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  return end == text ? fallback : value;
}

// The process's CPUs (E: as when the core first asked) and where they sit (F).
std::vector<CpuPlacement> placedCpus() {
  std::vector<CpuPlacement> placed;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (!CPU_ISSET(c, &common::processCpuMask())) continue;
    placed.push_back({topologyValue(c, "physical_package_id", 0),
                      topologyValue(c, "core_id", c), c});
  }
  return placed;
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

std::vector<int> cpuShare(std::vector<CpuPlacement> cpus, int local_index, int local_size) {
  const int n = static_cast<int>(cpus.size());
  if (n == 0 || local_size <= 0 || local_index < 0 || local_index >= local_size) return {};
  std::sort(cpus.begin(), cpus.end(), [](const CpuPlacement& a, const CpuPlacement& b) {
    return std::tie(a.package, a.core, a.cpu) < std::tie(b.package, b.core, b.cpu);
  });
  if (local_size > n) {  // C: one CPU each, local_size / n ranks on a CPU, as A splits CPUs
    const int per = local_size / n;
    const int crowded = local_size % n;  // the first CPUs take one rank more
    const int head = crowded * (per + 1);
    const int slot = local_index < head ? local_index / (per + 1)
                                        : crowded + (local_index - head) / per;
    return {cpus[static_cast<size_t>(slot)].cpu};
  }
  // A: shares of n / local_size, the first n % local_size of them one CPU larger.
  const int base = n / local_size;
  const int extra = n % local_size;
  const int first = local_index * base + std::min(local_index, extra);
  const int count = base + (local_index < extra ? 1 : 0);
  std::vector<int> share;
  for (int k = first; k < first + count; ++k) share.push_back(cpus[static_cast<size_t>(k)].cpu);
  std::sort(share.begin(), share.end());
  return share;
}

BindMode bindModeOf(const std::string& setting) {
  return setting == "core" ? BindMode::kCore : setting == "auto" ? BindMode::kAuto
                                                                 : BindMode::kNone;
}

namespace {
bool overlap(const common::CpuRanges& a, const common::CpuRanges& b) {
  for (const common::CpuRange& x : a) {
    for (const common::CpuRange& y : b) {
      if (x.first <= y.last && y.first <= x.last) return true;
    }
  }
  return false;
}
}  // namespace

MaskGroup maskGroupOf(const std::vector<common::CpuRanges>& host_cpus, size_t self) {
  MaskGroup group;
  if (self >= host_cpus.size()) return group;
  group.host_size = static_cast<int>(host_cpus.size());
  group.host_index = static_cast<int>(self);
  const common::CpuRanges& mine = host_cpus[self];
  group.size = 0;
  for (size_t r = 0; r < host_cpus.size(); ++r) {
    if (host_cpus[r] == mine) {
      group.index += r < self ? 1 : 0;
      ++group.size;
    } else if (mine.empty() || host_cpus[r].empty() || overlap(host_cpus[r], mine)) {
      group.apart = false;  // (an unknown set may be anything)
    }
  }
  return group;
}

CpuBinding bindRank(BindMode mode, const MaskGroup& group, bool cpus_crowded,
                    std::string* why) {
  CpuBinding out;
  out.host_cores = common::usableCores();
  if (bound_by_us && bindAllThreads(common::processCpuMask()) == 0) {
    bound_by_us = false;  // E: an earlier init's share is not this one's
  }
  if (mode == BindMode::kNone) return out;
  const std::vector<CpuPlacement> placed = placedCpus();
  const int n = static_cast<int>(placed.size());
  if (group.host_size == 1 || n == 0) return out;  // G: the share would be every CPU
  if (mode == BindMode::kAuto &&
      !(group.size > n && group.size % n == 0 && cpus_crowded && group.apart)) {
    return out;  // I: auto binds only C's even case, and says nothing where it does not
  }
  // J: a group whose CPUs are its own is split alone; else the host's ranks, by index.
  const int index = group.apart ? group.index : group.host_index;
  const int size = group.apart ? group.size : group.host_size;
  if (group.host_size > n && !cpus_crowded && (size == 1 || size > n)) {
    // C: this process's mask, not the host's CPUs
    *why = std::to_string(group.host_size) + " ranks on this host and this process may run "
           "on " + std::to_string(n) + " CPUs, which other ranks do not crowd (its affinity "
           "mask, perhaps set by the launcher: mpirun binds by default; --bind-to none there): "
           "not bound";
    return out;
  }
  if (size == 1) return out;  // J: its CPUs are its own: nothing to split
  const std::vector<int> share = cpuShare(placed, index, size);
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int cpu : share) {
    CPU_SET(cpu, &set);
    out.cpus += (out.cpus.empty() ? "" : ",") + std::to_string(cpu);
  }
  if (const int failure = bindAllThreads(set)) {  // H
    bindAllThreads(common::processCpuMask());  // no thread is left bound alone
    *why = "could not bind this process's threads to CPUs " + out.cpus + " (" +
           std::strerror(failure) + "; a cgroup cpuset may forbid them): not bound";
    out.cpus.clear();
    return out;
  }
  out.bound = bound_by_us = true;
  return out;
}

}  // namespace hvd::runtime
