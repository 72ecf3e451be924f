// The CPU list a peer announces in its rendezvous entry (common/cpu_ranges.h): text from
// another process. An accepted list must be ascending, disjoint and non-adjacent, every CPU
// below kMaxCpu, and print back (formatCpuRanges) to a text that parses to the same ranges;
// the rule that reads the lists (cpusOutnumbered) runs over it beside ranks of known lists.
#include <string>
#include <vector>

#include "common/cpu_ranges.h"
#include "fuzz.h"

namespace hvd::fuzz {
namespace {

using common::CpuRanges;

std::vector<std::string> cpuListSeeds(Rng& rng) {
  std::vector<std::string> seeds = {"0", "0-1", "0-3,8,10-11", "8191"};
  for (int s = 0; s < 4; ++s) {
    CpuRanges ranges;
    int next = static_cast<int>(rng.below(8));
    for (uint64_t n = 1 + rng.below(6); n > 0; --n) {
      const int last = next + static_cast<int>(rng.below(4));
      ranges.push_back({next, last});
      next = last + 2 + static_cast<int>(rng.below(64));
    }
    seeds.push_back(common::formatCpuRanges(ranges));
  }
  return seeds;
}

Outcome runCpuList(const std::string& in) {
  CpuRanges ranges;
  if (!common::parseCpuRanges(in, &ranges)) return rejected();
  for (size_t k = 0; k < ranges.size(); ++k) {
    const bool ordered = ranges[k].first <= ranges[k].last &&
                         (k == 0 || ranges[k].first > ranges[k - 1].last + 1);
    if (ranges[k].first < 0 || ranges[k].last >= common::kMaxCpu || !ordered) {
      return failed("accepted ranges out of order or out of bounds");
    }
  }
  CpuRanges again;
  if (!common::parseCpuRanges(common::formatCpuRanges(ranges), &again) || ranges != again) {
    return failed("the accepted list does not survive printing");
  }
  CpuRanges two;
  common::parseCpuRanges("0-1", &two);
  const std::vector<bool> verdicts = common::cpusOutnumbered({ranges, two, ranges, two}, 4);
  if (verdicts.size() != 4 || verdicts[0] != verdicts[2] || verdicts[1] != verdicts[3]) {
    return failed("ranks of equal CPU sets got different verdicts");
  }
  return accepted();
}

}  // namespace

void addCommonTargets(std::vector<Target>* out) {
  out->push_back({"cpu_list", "common::parseCpuRanges", cpuListSeeds, runCpuList});
}

}  // namespace hvd::fuzz
