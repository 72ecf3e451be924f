// CPU binding of a rank (HVD_CPU_BIND, Note [CPU binding] in cpu_binding.cc): each rank of a
// host runs on its own share of the host's CPUs. Runtime::init, before the loop starts.
#pragma once

#include <string>

#include "common/status.h"

namespace hvd::runtime {

struct CpuBinding {
  int host_cores = 0;   // CPUs the process could use before binding (its affinity mask)
  bool bound = false;   // every thread of the process now runs on `cpus` only
  std::string cpus;     // e.g. "2,3"; empty when not bound
};

// mode "none": nothing changes; "core": the process's CPUs are split into `local_size`
// contiguous shares and every thread is bound to share `local_index` — unless the host's ranks
// outnumber its CPUs (then nothing changes, and `why` says so). Any other mode: an error.
common::Status bindRank(const std::string& mode, int local_index, int local_size,
                        CpuBinding* out, std::string* why);

}  // namespace hvd::runtime
