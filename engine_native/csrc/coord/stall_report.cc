// The stall report and the stuck-collective query: which set members have not submitted a name
// that others are waiting on. Read-only views of the Coordinator's pending table.
#include <algorithm>
#include <map>

#include "coord/coordinator.h"

namespace hvd::coord {

namespace {
constexpr size_t kMaxNamesPerRank = 6;  // as Horovod's stall inspector: then "..."

std::string namesText(const std::vector<std::string>& names) {
  std::string out = "[";
  for (size_t i = 0; i < names.size() && i < kMaxNamesPerRank; ++i) {
    out += (i ? ", " : "") + names[i];
  }
  if (names.size() > kMaxNamesPerRank) out += ", ...";
  return out + "]";
}
}  // namespace

std::vector<int> Coordinator::missingRanks(Key key) const {
  std::vector<int> missing;
  const Pending* pending = pendingFor(key);
  if (pending == nullptr) return missing;
  const int32_t set_id = keys_.set(key);
  auto set = sets_.find(set_id);
  if (set == sets_.end()) return missing;
  for (int rank : set->second.members) {
    if (!submitted(*pending, rank) && !hasJoined(set_id, rank)) missing.push_back(rank);
  }
  return missing;
}

// Horovod's wording, so that users (and their search engines) recognise it.
std::string Coordinator::stallReport(std::chrono::seconds older_than) const {
  const auto now = std::chrono::steady_clock::now();
  std::map<int, std::vector<std::string>> by_rank;  // global rank -> names it has not sent
  for (const Pending& pending : table_) {
    if (!pending.key.assigned() || now - pending.first_seen < older_than) continue;
    for (int rank : missingRanks(pending.key)) by_rank[rank].push_back(keys_.name(pending.key));
  }
  if (by_rank.empty()) return std::string();
  std::string out =
      "One or more tensors were submitted to be reduced, gathered or broadcasted by subset of "
      "ranks and are waiting for remainder of ranks for more than " +
      std::to_string(older_than.count()) +
      " seconds. This may indicate that different ranks are trying to submit different tensors "
      "or that only subset of ranks is submitting tensors, which will cause deadlock.\n"
      "Missing ranks:";
  for (auto& [rank, names] : by_rank) {
    std::sort(names.begin(), names.end());
    out += "\n" + std::to_string(rank) + ": " + namesText(names);
  }
  return out;
}

}  // namespace hvd::coord
