// Coordinator: process sets, readiness, join and release. Validation lives in validation.cc,
// fusion in fusion.cc, the stall report in stall_report.cc.
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

namespace {
bool submitted(const std::vector<Request>& requests, int rank) {
  return std::any_of(requests.begin(), requests.end(),
                     [rank](const Request& r) { return r.request_rank == rank; });
}
}  // namespace

Coordinator::Coordinator(int world_size) : world_size_(world_size) {
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
  for (auto it = table_.lower_bound(Key(id, std::string()));
       it != table_.end() && it->first.first == id;) {
    it = table_.erase(it);
  }
  joined_.erase(id);
  cache_.eraseSet(id);
}

common::Status Coordinator::add(const Request& request) {
  auto set_it = sets_.find(request.process_set);
  const std::string who = " (rank " + std::to_string(request.request_rank) + ", tensor '" +
                          request.name + "')";
  if (set_it == sets_.end()) {
    return common::invalidArgument("Process set " + std::to_string(request.process_set) +
                                   " is not registered" + who + ".");
  }
  const ProcessSetInfo& set = set_it->second;
  if (request.request_rank < 0 || request.request_rank >= world_size_) {
    return common::invalidArgument("Rank " + std::to_string(request.request_rank) +
                                   " is outside the world of " + std::to_string(world_size_) +
                                   " ranks" + who + ".");
  }
  if (!std::binary_search(set.members.begin(), set.members.end(), request.request_rank)) {
    return common::invalidArgument("Rank " + std::to_string(request.request_rank) +
                                   " is not a member of process set " +
                                   std::to_string(set.id) + who + ".");
  }
  if (request.type == OpType::kJoin) return addJoin(request, set);

  const Key key(set.id, request.name);
  auto [it, inserted] = table_.try_emplace(key);
  Pending& pending = it->second;
  if (inserted) {
    pending.first_seen = std::chrono::steady_clock::now();
    pending.sequence = next_sequence_++;
  } else if (submitted(pending.requests, request.request_rank)) {
    return common::invalidArgument("Rank " + std::to_string(request.request_rank) +
                                   " submitted tensor '" + request.name +
                                   "' again before it completed; names must be unique.");
  }
  pending.requests.push_back(request);
  if (isReady(set, pending)) release(set, key);
  return common::Status::ok();
}

common::Status Coordinator::addJoin(const Request& request, const ProcessSetInfo& set) {
  std::vector<int>& joined = joined_[set.id];
  if (std::find(joined.begin(), joined.end(), request.request_rank) != joined.end()) {
    return common::invalidArgument("Rank " + std::to_string(request.request_rank) +
                                   " joined process set " + std::to_string(set.id) +
                                   " twice before every rank joined.");
  }
  joined.push_back(request.request_rank);

  // Names that waited only for ranks that have now joined become ready (Note [Join]).
  std::vector<std::pair<uint64_t, Key>> now_ready;
  for (auto it = table_.lower_bound(Key(set.id, std::string()));
       it != table_.end() && it->first.first == set.id; ++it) {
    if (isReady(set, it->second)) now_ready.emplace_back(it->second.sequence, it->first);
  }
  std::sort(now_ready.begin(), now_ready.end());
  for (const auto& entry : now_ready) release(set, entry.second);

  if (joined.size() == set.members.size()) {
    Response done;
    done.type = OpType::kJoin;
    done.names = {request.name};
    done.process_set = set.id;
    done.device = request.device;
    done.last_joined_rank = request.request_rank;
    joined_.erase(set.id);
    ready_.push_back(std::move(done));
  }
  return common::Status::ok();
}

bool Coordinator::hasJoined(int32_t set_id, int rank) const {
  auto it = joined_.find(set_id);
  return it != joined_.end() &&
         std::find(it->second.begin(), it->second.end(), rank) != it->second.end();
}

bool Coordinator::isReady(const ProcessSetInfo& set, const Pending& pending) const {
  size_t covered = pending.requests.size();  // submitters are distinct members
  auto it = joined_.find(set.id);
  if (it != joined_.end()) {
    for (int rank : it->second) covered += submitted(pending.requests, rank) ? 0 : 1;
  }
  return covered == set.members.size();
}

void Coordinator::release(const ProcessSetInfo& set, const Key& key) {
  auto it = table_.find(key);
  std::vector<Request> requests = std::move(it->second.requests);
  table_.erase(it);
  ready_.push_back(construct(set, std::move(requests)));
}

Response Coordinator::construct(const ProcessSetInfo& set, std::vector<Request> requests) {
  std::sort(requests.begin(), requests.end(), [](const Request& a, const Request& b) {
    return a.request_rank < b.request_rank;
  });
  std::vector<int> absent;  // joined without submitting: they contribute zeros
  auto joined = joined_.find(set.id);
  if (joined != joined_.end()) {
    for (int rank : joined->second) {
      if (!submitted(requests, rank)) absent.push_back(rank);
    }
    std::sort(absent.begin(), absent.end());
  }
  if (absent.empty()) {
    if (const Response* hit = cache_.find(set.id, requests.front().name, requests)) return *hit;
  }
  Response response = buildResponse(set.members, requests, absent);
  if (absent.empty()) cache_.put(set.id, requests, response);
  return response;
}

std::vector<Response> Coordinator::takeReady() {
  std::vector<Response> out = fuseResponses(std::move(ready_), fusion_threshold_);
  ready_.clear();
  return out;
}

}  // namespace hvd::coord
