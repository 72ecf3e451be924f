#include "common/cpu_ranges.h"

#include <algorithm>

namespace hvd::common {

namespace {

// A CPU number at text[*pos]: decimal digits, below kMaxCpu; *pos moves past it.
bool readCpu(std::string_view text, size_t* pos, int* cpu) {
  const size_t start = *pos;
  int value = 0;
  for (; *pos < text.size() && text[*pos] >= '0' && text[*pos] <= '9'; ++*pos) {
    value = value * 10 + (text[*pos] - '0');
    if (value >= kMaxCpu) return false;  // checked per digit: no overflow
  }
  *cpu = value;
  return *pos > start;
}

// Whether every CPU of `inner` is in `outer`. O(|inner| + |outer|): both ascending, and a
// range of `inner` lies within one of `outer`'s, which are non-adjacent.
bool within(const CpuRanges& inner, const CpuRanges& outer) {
  size_t j = 0;
  for (const CpuRange& range : inner) {
    while (j < outer.size() && outer[j].last < range.first) ++j;
    if (j == outer.size() || outer[j].first > range.first || outer[j].last < range.last) {
      return false;
    }
  }
  return true;
}

// The group rule: rank `self` and the ranks whose CPUs overlap its own, directly or through
// one another's, against the CPUs they span. Ranks are joined (union-find) along a sweep of
// every rank's ranges by their first CPU: ranges that overlap the block swept so far join its
// ranks, and the blocks, once joined, are the groups' disjoint CPUs.
bool groupOutnumbered(const std::vector<CpuRanges>& cpus, size_t self) {
  struct Piece {
    int first, last;
    size_t rank;
  };
  std::vector<Piece> pieces;
  for (size_t r = 0; r < cpus.size(); ++r) {
    for (const CpuRange& range : cpus[r]) pieces.push_back({range.first, range.last, r});
  }
  std::sort(pieces.begin(), pieces.end(),
            [](const Piece& a, const Piece& b) { return a.first < b.first; });
  std::vector<size_t> parent(cpus.size());
  for (size_t r = 0; r < parent.size(); ++r) parent[r] = r;
  auto root = [&parent](size_t r) {
    while (parent[r] != r) r = parent[r] = parent[parent[r]];
    return r;
  };
  std::vector<Piece> blocks;  // disjoint, each with one of its ranks
  for (const Piece& piece : pieces) {
    if (blocks.empty() || piece.first > blocks.back().last) {
      blocks.push_back(piece);
      continue;
    }
    parent[root(piece.rank)] = root(blocks.back().rank);
    blocks.back().last = std::max(blocks.back().last, piece.last);
  }
  const size_t group = root(self);
  size_t ranks = 0, group_cpus = 0;
  for (size_t r = 0; r < cpus.size(); ++r) ranks += root(r) == group;
  for (const Piece& block : blocks) {
    if (root(block.rank) == group) group_cpus += static_cast<size_t>(block.last - block.first) + 1;
  }
  return ranks > group_cpus;
}

}  // namespace

CpuRanges cpuRangesOf(const cpu_set_t& set) {
  CpuRanges ranges;
  for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
    if (!CPU_ISSET(cpu, &set)) continue;
    if (!ranges.empty() && ranges.back().last == cpu - 1) {
      ranges.back().last = cpu;
    } else {
      ranges.push_back({cpu, cpu});
    }
  }
  return ranges;
}

std::string formatCpuRanges(const CpuRanges& ranges) {
  std::string text;
  for (const CpuRange& range : ranges) {
    if (!text.empty()) text += ',';
    text += std::to_string(range.first);
    if (range.last != range.first) text += '-' + std::to_string(range.last);
  }
  return text;
}

bool parseCpuRanges(std::string_view text, CpuRanges* out) {
  out->clear();
  if (text.empty()) return true;
  size_t pos = 0;
  for (;;) {
    CpuRange range;
    if (!readCpu(text, &pos, &range.first)) return false;
    range.last = range.first;
    if (pos < text.size() && text[pos] == '-') {
      ++pos;
      if (!readCpu(text, &pos, &range.last) || range.last < range.first) return false;
    }
    if (!out->empty() && range.first <= out->back().last) return false;  // not ascending
    if (!out->empty() && range.first == out->back().last + 1) {
      out->back().last = range.last;
    } else {
      out->push_back(range);
    }
    if (pos == text.size()) return true;
    if (text[pos++] != ',') return false;
  }
}

size_t cpuCount(const CpuRanges& ranges) {
  size_t n = 0;
  for (const CpuRange& range : ranges) n += static_cast<size_t>(range.last - range.first) + 1;
  return n;
}

bool cpusOutnumbered(const std::vector<CpuRanges>& cpus, size_t self, int fallback_cpus) {
  if (self >= cpus.size()) return false;
  for (const CpuRanges& ranges : cpus) {
    if (ranges.empty()) return static_cast<int>(cpus.size()) > fallback_cpus;
  }
  if (groupOutnumbered(cpus, self)) return true;
  size_t confined = 0;  // the second rule: ranks whose CPUs all lie within self's
  for (const CpuRanges& ranges : cpus) confined += within(ranges, cpus[self]);
  return confined > cpuCount(cpus[self]);
}

}  // namespace hvd::common
