#include "common/cpu_ranges.h"

#include <algorithm>
#include <map>

#include "common/test_switch.h"

namespace hvd::common {

namespace {

// A CPU number at text[*pos]: decimal digits, below kMaxCpu; *pos moves past it.
bool readCpu(std::string_view text, size_t* pos, int* cpu) {
  const size_t start = *pos;
  if (start + 1 < text.size() && text[start] == '0' && text[start + 1] >= '0' &&
      text[start + 1] <= '9') {
    return false;  // "007": not as the kernel writes a CPU
  }
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

// The group rule for every rank: a rank and the ranks whose CPUs overlap its own, directly or
// through one another's, against the CPUs they span. Ranks are joined (union-find) along a
// sweep of every rank's ranges by their first CPU: ranges that overlap the block swept so far
// join its ranks, and the blocks, once joined, are the groups' disjoint CPUs.
std::vector<bool> groupsOutnumbered(const std::vector<CpuRanges>& cpus) {
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
  std::vector<size_t> ranks(cpus.size(), 0), group_cpus(cpus.size(), 0);  // by root
  for (size_t r = 0; r < cpus.size(); ++r) ++ranks[root(r)];
  for (const Piece& block : blocks) {
    group_cpus[root(block.rank)] += static_cast<size_t>(block.last - block.first) + 1;
  }
  std::vector<bool> out(cpus.size());
  for (size_t r = 0; r < cpus.size(); ++r) out[r] = ranks[root(r)] > group_cpus[root(r)];
  return out;
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

bool testCpuMask(cpu_set_t* out) {
  CpuRanges forced;
  const char* text = HVD_TEST_SWITCH("CPU_MASK");
  if (text == nullptr || !parseCpuRanges(text, &forced)) return false;
  CPU_ZERO(out);
  for (const CpuRange& r : forced) {
    for (int c = r.first; c <= r.last && c < CPU_SETSIZE; ++c) CPU_SET(c, out);
  }
  return true;
}

size_t cpuCount(const CpuRanges& ranges) {
  size_t n = 0;
  for (const CpuRange& range : ranges) n += static_cast<size_t>(range.last - range.first) + 1;
  return n;
}

std::vector<bool> cpusOutnumbered(const std::vector<CpuRanges>& cpus, int fallback_cpus) {
  for (const CpuRanges& ranges : cpus) {
    if (ranges.empty()) {
      return std::vector<bool>(cpus.size(), static_cast<int>(cpus.size()) > fallback_cpus);
    }
  }
  std::vector<bool> out = groupsOutnumbered(cpus);
  // The confined rule, over the distinct sets (honest ranks of a machine share a few): a set
  // is crowded where the ranks within it outnumber its CPUs (one of at least as many CPUs as
  // the machine has ranks cannot be), and a rank yields where its set lies in a crowded one.
  std::vector<size_t> order(cpus.size());
  for (size_t r = 0; r < order.size(); ++r) order[r] = r;
  std::sort(order.begin(), order.end(), [&cpus](size_t a, size_t b) { return cpus[a] < cpus[b]; });
  std::vector<size_t> distinct, ranks;  // a rank of each distinct set, and how many share it
  for (size_t r : order) {
    if (distinct.empty() || cpus[distinct.back()] != cpus[r]) {
      distinct.push_back(r);
      ranks.push_back(0);
    }
    ++ranks.back();
  }
  std::vector<bool> crowded(distinct.size(), false);
  for (size_t d = 0; d < distinct.size(); ++d) {
    const CpuRanges& mine = cpus[distinct[d]];
    const size_t count = cpuCount(mine);
    if (count >= cpus.size()) continue;
    size_t confined = 0;
    for (size_t e = 0; e < distinct.size(); ++e) {
      const CpuRanges& theirs = cpus[distinct[e]];
      if (theirs.front().first >= mine.front().first && theirs.back().last <= mine.back().last &&
          within(theirs, mine)) {
        confined += ranks[e];
      }
    }
    crowded[d] = confined > count;
  }
  std::vector<bool> inside(distinct.size(), false);  // within some crowded set, its own too
  for (size_t e = 0; e < distinct.size(); ++e) {
    for (size_t d = 0; d < distinct.size() && !inside[e]; ++d) {
      inside[e] = crowded[d] && within(cpus[distinct[e]], cpus[distinct[d]]);
    }
  }
  for (size_t d = 0, k = 0; d < distinct.size(); ++d) {
    for (size_t i = 0; i < ranks[d]; ++i, ++k) out[order[k]] = out[order[k]] || inside[d];
  }
  return out;
}

SpinVerdicts spinVerdicts(const std::vector<std::string>& host,
                          const std::vector<std::string>& machine,
                          const std::vector<CpuRanges>& cpus, size_t self, int online_cpus) {
  std::map<std::string, size_t> host_ranks;
  for (const std::string& h : host) ++host_ranks[h];
  std::vector<size_t> ranks;  // self's machine's, in world order
  std::vector<CpuRanges> machine_cpus;
  bool known = true;  // every verdict below comes from the table alone
  for (size_t r = 0; r < host.size(); ++r) {
    known = known && (host[r] != host[self] || machine[r] == machine[self]);
    if (machine[r] != machine[self]) continue;
    ranks.push_back(r);
    machine_cpus.push_back(cpus[r]);
    known = known && !cpus[r].empty();
  }
  const std::vector<bool> crowded = cpusOutnumbered(machine_cpus, online_cpus);
  SpinVerdicts out;
  for (size_t k = 0; k < ranks.size(); ++k) {
    const size_t r = ranks[k];
    const size_t usable = cpus[r].empty() ? static_cast<size_t>(online_cpus) : cpuCount(cpus[r]);
    const bool yields = host_ranks[host[r]] > usable || crowded[k];
    if (r == self) {
      out.self = yields;
      out.crowded = crowded[k];
    }
    if (host[r] == host[self]) out.host = out.host || yields;
  }
  out.host = out.host && known;
  return out;
}

}  // namespace hvd::common
