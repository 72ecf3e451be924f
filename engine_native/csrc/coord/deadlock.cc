// The deadlock shutdown: rank 0 fails the pending names that can never complete, on every rank,
// with a report of what each rank waits for (HVD_STALL_SHUTDOWN_TIME). A read of the
// Coordinator's pending table and join state; the error Responses leave through takeReady.
//
// Note [Deadlock shutdown]
// Ranks match ops by name, so ranks that ran different op sequences (a rank ran an extra
// unnamed op, a branch taken on one rank only) wait for names no other rank submits: Horovod
// warns about such a stall forever (or, with HOROVOD_STALL_SHUTDOWN_TIME_SECONDS, shuts the job
// down for any long stall). Here rank 0 fails exactly the names that cannot complete:
//   a. A wait is a pending name (or a set's join in progress): its submitters (the joined
//      ranks) wait for its missing ranks.
//   b. Candidates: the ranks that submit some wait and have sent no request for at least the
//      shutdown time (a rank that still submits is making progress, a rank that submits
//      nothing at all may be computing: neither is a candidate).
//   c. Repeatedly drop every submitter of a wait that misses a rank that is not a candidate:
//      that wait may still complete and unblock them.
//   d. What remains waits only for ranks that wait themselves and have been silent for the
//      whole shutdown time: nothing of theirs can ever complete.
//   e. Only the ranks on a cycle of that wait-for graph are deadlocked; the others wait for
//      them (a rank blocked on a global op while two others deadlock in their process set),
//      and their ops may complete once the deadlocked ranks go on. Each wait of a rank on a
//      cycle becomes an error Response for its set (every member fails it: the submitters'
//      handles get the report, the others have no entry for it), and the name leaves the
//      table, so the job stays usable: later ops that agree run.
// A rank late by less than the shutdown time is never failed: it submitted within that time,
// so it is no candidate (b), and the ranks waiting for it are dropped (c). The rule cannot
// tell a rank blocked on a handle from one computing for longer than the shutdown time with
// async ops pending (the core never sees the framework thread), so it is off unless asked for
// (HVD_STALL_SHUTDOWN_TIME, common/config.cc; Horovod's default is never too).
#include <algorithm>
#include <map>
#include <set>

#include "coord/coordinator.h"

namespace hvd::coord {

namespace {

struct Wait {
  Key key;
  int32_t set = 0;
  OpType type = OpType::kAllreduce;
  int32_t device = -1;
  std::vector<int> submitters;
  std::vector<int> missing;
};

std::string ranksText(const std::vector<int>& ranks) {
  std::string out;
  for (size_t i = 0; i < ranks.size(); ++i) out += (i ? ", " : "") + std::to_string(ranks[i]);
  return out;
}

// Step c: the candidates that wait only for candidates.
std::set<int> stuckRanks(const std::vector<Wait>& waits, std::set<int> stuck) {
  for (bool changed = true; changed;) {
    changed = false;
    for (const Wait& w : waits) {
      const bool hopeless = std::all_of(w.missing.begin(), w.missing.end(),
                                        [&](int m) { return stuck.count(m) != 0; });
      if (hopeless) continue;
      for (int r : w.submitters) changed |= stuck.erase(r) != 0;
    }
  }
  return stuck;
}

// The error of every wait with a deadlocked submitter (listed in *failing): what each of those
// ranks waits for, in Horovod's stall-report layout ("<rank>: [names]").
std::string deadlockReport(const std::vector<Wait>& waits, const std::set<int>& deadlocked,
                           std::chrono::duration<double> silent_for, const KeyTable& keys,
                           std::vector<const Wait*>* failing) {
  std::map<int, std::vector<std::string>> by_rank;
  for (const Wait& w : waits) {
    if (std::none_of(w.submitters.begin(), w.submitters.end(),
                     [&](int r) { return deadlocked.count(r) != 0; })) {
      continue;
    }
    failing->push_back(&w);
    std::string what = keys.name(w.key);
    if (w.set != 0) what += " in process set " + std::to_string(w.set);
    what += " (missing ranks: " + ranksText(w.missing) + ")";
    for (int r : w.submitters) by_rank[r].push_back(what);
  }
  const auto seconds = static_cast<long long>(silent_for.count() + 0.5);
  std::string report =
      "Deadlock: ranks " + ranksText(std::vector<int>(deadlocked.begin(), deadlocked.end())) +
      " have been waiting for more than " + std::to_string(seconds) +
      " seconds for tensors that can never complete: each waits for ranks that are themselves "
      "blocked waiting for other tensors. The ranks submitted different ops (different "
      "names, or a different number of unnamed ops).\nWaiting ranks:";
  for (auto& [rank, names] : by_rank) {
    std::sort(names.begin(), names.end());
    report += "\n" + std::to_string(rank) + ": [";
    for (size_t i = 0; i < names.size(); ++i) report += (i ? ", " : "") + names[i];
    report += "]";
  }
  report += "\nThese ops failed on every rank (HVD_STALL_SHUTDOWN_TIME=" +
            std::to_string(seconds) + "); make every rank of a process set submit the same "
            "ops in the same order, or name them.";
  return report;
}

// Step e: the stuck ranks on a cycle (every wait of a stuck rank misses stuck ranks only).
std::set<int> deadlockedRanks(const std::vector<Wait>& waits, const std::set<int>& stuck) {
  std::map<int, std::set<int>> edges;  // rank -> the ranks it waits for
  for (const Wait& w : waits) {
    for (int r : w.submitters) {
      if (stuck.count(r) != 0) edges[r].insert(w.missing.begin(), w.missing.end());
    }
  }
  std::set<int> cyclic;
  for (int start : stuck) {
    std::set<int> seen;
    std::vector<int> todo(edges[start].begin(), edges[start].end());
    while (!todo.empty() && seen.count(start) == 0) {
      const int r = todo.back();
      todo.pop_back();
      if (!seen.insert(r).second) continue;
      todo.insert(todo.end(), edges[r].begin(), edges[r].end());
    }
    if (seen.count(start) != 0) cyclic.insert(start);
  }
  return cyclic;
}

}  // namespace

std::string Coordinator::failDeadlocked(std::chrono::steady_clock::time_point now,
                                        std::chrono::duration<double> silent_for) {
  if (pending_count_ == 0 && joined_.empty()) return std::string();
  std::vector<Wait> waits;  // step a
  for (const Pending& p : table_) {
    // A younger name's submitters sent it within the shutdown time: no candidates (b), and
    // it cannot change step c. So the steady state looks at no name at all.
    if (!p.key.assigned() || now - p.first_seen < silent_for) continue;
    Wait w;
    w.key = p.key;
    w.set = keys_.set(p.key);
    w.type = p.count ? p.requests[0].type : OpType::kAllreduce;
    w.device = p.count ? p.requests[0].device : -1;
    for (size_t i = 0; i < p.count; ++i) w.submitters.push_back(p.requests[i].request_rank);
    w.missing = missingRanks(p.key);
    if (!w.missing.empty()) waits.push_back(std::move(w));
  }
  for (const auto& [set_id, joined] : joined_) {
    auto set = sets_.find(set_id);
    auto key = join_keys_.find(set_id);
    if (set == sets_.end() || key == join_keys_.end()) continue;
    Wait w;
    w.key = key->second;
    w.set = set_id;
    w.type = OpType::kJoin;
    w.submitters = joined;
    for (int r : set->second.members) {
      if (std::find(joined.begin(), joined.end(), r) == joined.end()) w.missing.push_back(r);
    }
    waits.push_back(std::move(w));
  }
  std::set<int> candidates;  // step b
  for (const Wait& w : waits) {
    for (int r : w.submitters) {
      if (now - last_request_[r] >= silent_for) candidates.insert(r);
    }
  }
  const std::set<int> deadlocked =
      deadlockedRanks(waits, stuckRanks(waits, std::move(candidates)));  // steps c, d, e
  if (deadlocked.empty()) return std::string();

  // The report, then an error Response per wait of a deadlocked rank.
  std::vector<const Wait*> failing;
  const std::string report = deadlockReport(waits, deadlocked, silent_for, keys_, &failing);
  for (const Wait* w : failing) {
    Response failed;
    failed.status = ResponseType::kError;
    failed.type = w->type;
    failed.keys = {w->key};
    failed.error = report;
    failed.process_set = w->set;
    failed.device = w->device;
    if (w->type == OpType::kJoin) {
      joined_.erase(w->set);
      join_keys_.erase(w->set);
    } else {
      Pending& p = table_[w->key.index];
      p.key = Key();
      p.count = 0;
      --pending_count_;
    }
    ready_.add(std::move(failed));
  }
  return report;
}

}  // namespace hvd::coord
