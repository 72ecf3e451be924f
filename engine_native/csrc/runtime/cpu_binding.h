// CPU binding of a rank (HVD_CPU_BIND, Note [CPU binding] in cpu_binding.cc): each rank of a
// host runs on its own share of the host's CPUs. Runtime::init, before the loop starts.
#pragma once

#include <string>
#include <vector>

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

// HVD_CPU_BIND: none, auto (the default: only where the host's ranks outnumber its CPUs by a
// whole multiple and may all run on the same CPUs, Note [CPU binding] I) or core.
enum class BindMode { kNone, kAuto, kCore };
BindMode bindModeOf(const std::string& setting);

// Under kNone nothing is bound (an earlier init's binding is undone); under kCore the
// process's CPUs are split into `local_size` shares and every thread is bound to share
// `local_index` (one CPU that other ranks share, where the ranks outnumber the CPUs and
// `cpus_crowded`, Mesh::cpusCrowded(), agrees); under kAuto only that last case, only where
// the ranks outnumber the CPUs by a whole multiple and only where every rank of the host may run on
// the same CPUs as this one (`masks_alike`, from the peer table). Where it cannot (more ranks
// than CPUs in this process's mask alone; a refusal), nothing is bound and `why` says why
// (kCore; kAuto says nothing where its case does not hold). Runtime::init only.
CpuBinding bindRank(BindMode mode, int local_index, int local_size, bool cpus_crowded,
                    bool masks_alike, std::string* why);

}  // namespace hvd::runtime
