// CPU binding of a rank (HVD_CPU_BIND, Note [CPU binding] in cpu_binding.cc): each rank of a
// host runs on its own share of the host's CPUs. Runtime::init, before the loop starts.
#pragma once

#include <string>
#include <vector>

#include "common/cpu_ranges.h"

namespace hvd::runtime {

struct CpuBinding {
  int host_cores = 0;   // CPUs the process could use before binding (its affinity mask)
  bool bound = false;   // every thread of the process now runs on `cpus` only
  std::string cpus;     // e.g. "2,3"; empty when not bound
};

// A CPU and where it sits (sysfs topology): the order in which CPUs are split (Note [CPU
// binding] F).
struct CpuPlacement {
  long package = 0;
  long core = 0;
  int cpu = 0;
};

// Share `local_index` of `cpus` split into `local_size` runs, whole cores first (Note [CPU
// binding] A, F), in CPU order; where the ranks outnumber the CPUs, the one CPU of a run of
// local_size / CPUs ranks (the first CPUs one rank more: C); empty for a bad index or no CPUs.
std::vector<int> cpuShare(std::vector<CpuPlacement> cpus, int local_index, int local_size);

// Note [CPU binding] J: a rank's place among the ranks of its host that may run on exactly its
// CPUs (`host_cpus`, in local-index order, from the peer table; `self` its local index), and
// whether every other rank of the host may run on the same CPUs or on none of them.
struct MaskGroup {
  int index = 0;
  int size = 1;
  bool apart = true;
  int host_index = 0;  // among the host's ranks
  int host_size = 1;
};
MaskGroup maskGroupOf(const std::vector<common::CpuRanges>& host_cpus, size_t self);

// HVD_CPU_BIND: none, auto (the default: only where the ranks that may run on the same CPUs
// outnumber them by a whole multiple and no other rank of the host may run on them, Note [CPU
// binding] I) or core.
enum class BindMode { kNone, kAuto, kCore };
BindMode bindModeOf(const std::string& setting);

// Under kNone nothing is bound (an earlier init's binding is undone); under kCore the
// process's CPUs are split into `group.size` shares and every thread is bound to share
// `group.index` (`host_size` and `host_index` where the group is not apart: J) (one CPU that
// other ranks share, where the ranks outnumber the CPUs and
// `cpus_crowded`, Mesh::cpusCrowded(), agrees); under kAuto only that last case, only where
// the group outnumbers the CPUs by a whole multiple and only where its CPUs are no other
// group's (`group.apart`). Where it cannot (more ranks than CPUs in this process's mask
// alone; a refusal), nothing is bound and `why` says why (kCore; kAuto says nothing where its
// case does not hold). Runtime::init only.
CpuBinding bindRank(BindMode mode, const MaskGroup& group, bool cpus_crowded, std::string* why);

}  // namespace hvd::runtime
