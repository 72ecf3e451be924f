// Coordinator: process sets, readiness, join and release. Validation lives in validation.cc,
// fusion in fusion.cc, the stall report in stall_report.cc, the deadlock shutdown in deadlock.cc.
//
// Note [Global response order]
// Every Response leaves rank 0 through takeReady: in the order names became ready (when one add
// releases several names, in the order their first requests arrived), then fused, which keeps
// relative order (fusion.h). Every member of a set executes that set's responses in exactly this
// order, so no two ranks ever run collectives in different orders, whatever order their
// frameworks enqueued in. Workers rely on it by executing responses in arrival order.
//
// Note [Grouped requests]
// A grouped op (group_id >= 0) is enqueued atomically on each rank, so each rank sends the whole
// group in one RequestList, and the runtime adds a whole list before it calls takeReady. The add
// that completes one name of a group (the last rank's list) therefore completes all of them,
// so the group is released by one takeReady and fuses as far as the threshold and its members'
// parameters allow. Rank 0 needs no group table; group_id is not compared across ranks.
//
// Note [Join]
// A kJoin request marks its rank joined for that set. From then on a name is ready when every
// member has submitted it or joined; joined ranks that did not submit contribute zeros to an
// allreduce (they receive its Response, whose counts give the sizes) and make any other op an
// error Response. When every member has joined, a kJoin Response (last_joined_rank = the rank
// whose join completed the set) follows the names released by that join, and the set's joined
// state is reset. Responses built with joined ranks are never cached.
#include "coord/coordinator.h"

#include <algorithm>

#include "coord/fusion.h"
#include "coord/validation.h"

namespace hvd::coord {

Coordinator::Coordinator(int world_size, const KeyTable& keys)
    : world_size_(world_size),
      keys_(keys),
      last_request_(static_cast<size_t>(world_size), std::chrono::steady_clock::now()),
      ready_(fusion_threshold_) {
  ProcessSetInfo global;
  global.id = 0;
  for (int rank = 0; rank < world_size; ++rank) global.members.push_back(rank);
  sets_[0] = global;
}

void Coordinator::addProcessSet(const ProcessSetInfo& set) {
  ProcessSetInfo sorted = set;
  std::sort(sorted.members.begin(), sorted.members.end());
  sorted.members.erase(std::unique(sorted.members.begin(), sorted.members.end()),
                       sorted.members.end());
  auto it = sets_.find(sorted.id);
  if (it != sets_.end() && it->second.members == sorted.members) return;
  if (it != sets_.end()) forgetSet(sorted.id);  // new membership: old state means nothing
  sets_[sorted.id] = sorted;
}

void Coordinator::removeProcessSet(int32_t id) {
  forgetSet(id);
  sets_.erase(id);
}

// Drops the pending names, join state and cached responses of a set (their requesters are
// failed by the runtime, which removes a set only when it is idle).
void Coordinator::forgetSet(int32_t id) {
  for (Pending& p : table_) {
    if (!p.key.assigned() || keys_.set(p.key) != id) continue;
    p.key = Key();
    p.count = 0;
    --pending_count_;
  }
  joined_.erase(id);
  join_keys_.erase(id);
  cache_.eraseSet(id);
}

Coordinator::Pending* Coordinator::pendingFor(Key key) {
  if (key.index >= table_.size() || table_[key.index].key != key) return nullptr;
  return &table_[key.index];
}

const Coordinator::Pending* Coordinator::pendingFor(Key key) const {
  if (key.index >= table_.size() || table_[key.index].key != key) return nullptr;
  return &table_[key.index];
}

bool Coordinator::submitted(const Pending& pending, int rank) const {
  for (size_t i = 0; i < pending.count; ++i) {
    if (pending.requests[i].request_rank == rank) return true;
  }
  return false;
}

common::Status Coordinator::add(Key key, const Request& request, int32_t rank,
                                std::chrono::steady_clock::time_point now) {
  auto who = [&] {
    return " (rank " + std::to_string(rank) + ", tensor '" + keys_.name(key) + "')";
  };
  auto set_it = sets_.find(request.process_set);
  if (set_it == sets_.end()) {
    return common::invalidArgument("Process set " + std::to_string(request.process_set) +
                                   " is not registered" + who() + ".");
  }
  const ProcessSetInfo& set = set_it->second;
  if (rank < 0 || rank >= world_size_) {
    return common::invalidArgument("Rank " + std::to_string(rank) + " is outside the world of " +
                                   std::to_string(world_size_) + " ranks" + who() + ".");
  }
  if (!std::binary_search(set.members.begin(), set.members.end(), rank)) {
    return common::invalidArgument("Rank " + std::to_string(rank) +
                                   " is not a member of process set " +
                                   std::to_string(set.id) + who() + ".");
  }
  last_request_[rank] = now;  // Note [Deadlock shutdown] b
  if (request.type == OpType::kJoin) return addJoin(key, request, rank, set);

  if (key.index >= table_.size()) table_.resize(std::max<size_t>(key.index + 1, 64));
  Pending& pending = table_[key.index];
  if (pending.key != key) {  // the first request for this name (a stale slot is overwritten)
    if (!pending.key.assigned()) ++pending_count_;
    pending.key = key;
    pending.count = 0;
    pending.first_seen = now;
    pending.sequence = next_sequence_++;
  } else if (submitted(pending, rank)) {
    return common::invalidArgument("Rank " + std::to_string(rank) + " submitted tensor '" +
                                   keys_.name(key) + "' again before it completed; names must be "
                                   "unique.");
  }
  if (pending.count == pending.requests.size()) pending.requests.emplace_back();
  Request& stored = pending.requests[pending.count++];
  stored = request;  // reuses the slot's string and vector storage
  stored.request_rank = rank;
  stored.key = key;
  if (isReady(set, pending)) release(set, pending);
  return common::Status::ok();
}

common::Status Coordinator::addJoin(Key key, const Request& request, int32_t rank,
                                    const ProcessSetInfo& set) {
  std::vector<int>& joined = joined_[set.id];
  if (std::find(joined.begin(), joined.end(), rank) != joined.end()) {
    return common::invalidArgument("Rank " + std::to_string(rank) + " joined process set " +
                                   std::to_string(set.id) + " twice before every rank joined.");
  }
  joined.push_back(rank);
  join_keys_[set.id] = key;

  // Names that waited only for ranks that have now joined become ready (Note [Join]), in the
  // order their first requests arrived.
  std::vector<std::pair<uint64_t, uint32_t>> now_ready;
  for (uint32_t i = 0; i < table_.size(); ++i) {
    const Pending& p = table_[i];
    if (p.key.assigned() && keys_.set(p.key) == set.id && isReady(set, p)) {
      now_ready.emplace_back(p.sequence, i);
    }
  }
  std::sort(now_ready.begin(), now_ready.end());
  for (const auto& entry : now_ready) release(set, table_[entry.second]);

  if (joined.size() == set.members.size()) {
    Response done;
    done.type = OpType::kJoin;
    done.keys = {key};
    done.process_set = set.id;
    done.device = request.device;
    done.last_joined_rank = rank;
    joined_.erase(set.id);
    join_keys_.erase(set.id);
    ready_.add(std::move(done));
  }
  return common::Status::ok();
}

bool Coordinator::hasJoined(int32_t set_id, int rank) const {
  auto it = joined_.find(set_id);
  return it != joined_.end() &&
         std::find(it->second.begin(), it->second.end(), rank) != it->second.end();
}

bool Coordinator::isReady(const ProcessSetInfo& set, const Pending& pending) const {
  size_t covered = pending.count;  // submitters are distinct members
  if (joined_.empty()) return covered == set.members.size();
  auto it = joined_.find(set.id);
  if (it != joined_.end()) {
    for (int rank : it->second) covered += submitted(pending, rank) ? 0 : 1;
  }
  return covered == set.members.size();
}

// Builds the name's Response (from the cache when every request repeats the cached ones) and
// frees the slot.
void Coordinator::release(const ProcessSetInfo& set, Pending& pending) {
  Request* requests = pending.requests.data();
  const size_t count = pending.count;
  auto byRank = [](const Request& a, const Request& b) { return a.request_rank < b.request_rank; };
  if (!std::is_sorted(requests, requests + count, byRank)) {
    std::sort(requests, requests + count, byRank);
  }
  std::vector<int> absent;  // joined without submitting: they contribute zeros
  auto joined = joined_.empty() ? joined_.end() : joined_.find(set.id);
  if (joined != joined_.end()) {
    for (int rank : joined->second) {
      if (!submitted(pending, rank)) absent.push_back(rank);
    }
    std::sort(absent.begin(), absent.end());
  }
  const Response* hit = absent.empty() ? cache_.find(pending.key, requests, count) : nullptr;
  if (hit != nullptr) {
    ready_.add(Response(*hit));
  } else {
    // Validation names the tensor in its errors; local requests carry only their key.
    for (size_t i = 0; i < count; ++i) {
      if (requests[i].name.empty()) requests[i].name = keys_.name(pending.key);
    }
    Response built = buildResponse(set.members, std::vector<Request>(requests, requests + count),
                                   absent);
    if (absent.empty()) cache_.put(pending.key, requests, count, built);
    ready_.add(std::move(built));
  }
  pending.key = Key();
  pending.count = 0;
  --pending_count_;
}

std::vector<Response> Coordinator::takeReady() { return ready_.take(); }

void Coordinator::markKeys(const KeyTable::MarkFn& mark) const {
  for (const Response& r : ready_.responses()) {
    for (Key key : r.keys) mark(key);
  }
  if (pending_count_ == 0) return;
  for (const Pending& p : table_) {
    if (p.key.assigned()) mark(p.key);
  }
}

}  // namespace hvd::coord
