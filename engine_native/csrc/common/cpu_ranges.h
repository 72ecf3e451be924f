// A set of CPUs as ascending, disjoint, non-adjacent ranges: how a rank announces the CPUs it
// may use (transport::PeerInfo::cpus), and the rule that reads those announcements (Note
// [Yielding spins] B in transport/mesh.cc). On the wire it is the kernel's CPU list format
// ("0-3,8,10-11", as /sys/devices/system/cpu/online and `taskset -c` write it): a machine's
// CPUs in a few bytes, where a list of numbers cost ~5 KB per rank on 1024 CPUs, and N ranks'
// entries travel to every rank. Pure functions; any thread.
#pragma once

#include <sched.h>

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace hvd::common {

struct CpuRange {
  int first = 0;
  int last = 0;  // inclusive

  bool operator==(const CpuRange& o) const { return first == o.first && last == o.last; }
  bool operator<(const CpuRange& o) const {  // so CpuRanges compare as sequences
    return first != o.first ? first < o.first : last < o.last;
  }
};
using CpuRanges = std::vector<CpuRange>;  // ascending, disjoint, non-adjacent; empty: unknown

constexpr int kMaxCpu = 8192;  // CPUs announced are below this: the kernel's NR_CPUS limit

// The CPUs of `set`, as ranges.
CpuRanges cpuRangesOf(const cpu_set_t& set);

// "0-3,8"; "" for none.
std::string formatCpuRanges(const CpuRanges& ranges);

// Parses a peer's CPU list (bytes from another process): items "N" or "N-M" (N <= M), decimal
// digits only (no leading zero), comma-separated, ascending and disjoint, each CPU below
// kMaxCpu; adjacent items are merged. "" is an empty (unknown) set. False, `out` unspecified,
// on anything else. O(text).
bool parseCpuRanges(std::string_view text, CpuRanges* out);

// Test builds (common/test_switch.h): the mask HVD_TEST_CPU_MASK names, CPUs this machine may
// lack among them (common::processCpuMask). False, `out` untouched, where none is set.
bool testCpuMask(cpu_set_t* out);

// The number of CPUs in `ranges`.
size_t cpuCount(const CpuRanges& ranges);

// Note [Yielding spins] B, for every rank of one machine: whether rank r's CPUs (cpus[r]) are
// outnumbered by the ranks that compete for them. True where
//   - r and the ranks whose CPUs overlap its own, directly or through one another's,
//     outnumber the CPUs of that group, or
//   - r's CPUs lie within some rank's CPUs C (r's own among them) and the ranks whose CPUs
//     all lie within C outnumber C's CPUs: two ranks pinned to one CPU beside a rank free on
//     many share a core, whatever the group's total says, and so does a rank pinned to "2"
//     beside three on "1-2". (What only a matching of ranks to CPUs would see is not: ranks
//     on "0,1", "0,1", "1,2" and "0,2" crowd CPUs 0-2, which no rank's set is, beside a rank
//     on "0-5".)
// Where a set is empty (unknown), every rank counts against `fallback_cpus`. Cost: O(T log T)
// in the T ranges given, and O(D^2 S) for the D distinct sets of at most S ranges each
// (kMaxCpu bounds S), which honest ranks keep small: a machine's ranks share a few sets.
std::vector<bool> cpusOutnumbered(const std::vector<CpuRanges>& cpus, int fallback_cpus);

// Note [Yielding spins] for the ranks of a world: rank r is on host `host[r]` (ranks of one
// host name share its shared memory), on machine `machine[r]` (a kernel, whose CPUs they may
// share), and may use `cpus[r]`. A rank's spins yield where its host's ranks outnumber the CPUs
// it may use (`online_cpus` where unknown), or by cpusOutnumbered among its machine's ranks.
struct SpinVerdicts {
  bool self = false;  // rank `self`'s spins yield
  // The cpusOutnumbered half alone: ranks of self's machine crowd self's CPUs, whatever its
  // own mask's count (a launcher may have narrowed each rank's mask below its host's ranks).
  bool crowded = false;
  // Some rank of self's host's spins yield, as read from the table by any rank of the host:
  // the same answer on each. False where the table leaves it to a local value (a CPU set of
  // the machine unknown, the host's ranks on two machines).
  bool host = false;
};
SpinVerdicts spinVerdicts(const std::vector<std::string>& host,
                          const std::vector<std::string>& machine,
                          const std::vector<CpuRanges>& cpus, size_t self, int online_cpus);

}  // namespace hvd::common
