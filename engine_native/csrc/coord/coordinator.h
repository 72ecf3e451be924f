// Coordinator: rank 0's negotiation state — pure logic, no sockets, so it is tested alone.
// The background loop feeds it every Request (its own and the workers'), then asks for the
// Responses that became ready; it sends them to the members of each process set and executes
// its own share. Rule relied on everywhere: responses are produced in one global order and every
// rank executes those of its process sets in exactly that order.
// Ready = submitted by every member of the set that has not joined. Validation (dtype, shape,
// op, root, scales, device, splits agree) turns a bad name into an error Response naming the
// tensor, both ranks and both values. Ready allreduces with equal dtype/op/scales/set/device fuse
// up to the threshold with look-ahead past non-matching ones.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "coord/fusion.h"
#include "coord/message.h"
#include "coord/response_cache.h"

namespace hvd::coord {

struct ProcessSetInfo {
  int32_t id = 0;
  std::vector<int> members;  // global ranks, ascending
};

class Coordinator {
 public:
  // `keys` is rank 0's KeyTable: requests arrive with their key, and the table names tensors in
  // error messages and the stall report.
  Coordinator(int world_size, const KeyTable& keys);

  void addProcessSet(const ProcessSetInfo& set);
  void removeProcessSet(int32_t id);
  void setFusionThreshold(int64_t bytes) {
    fusion_threshold_ = bytes;
    ready_.setThreshold(bytes);
  }
  // Capacity of the validated-response cache (HVD_CACHE_CAPACITY; 0 disables). Clears it.
  void setCacheCapacity(int64_t entries) { cache_.setCapacity(entries); }

  // Records one request from global rank `rank` for `key` (rank 0's key of request.name; the
  // request's own request_rank is ignored). Returns an error Status only for a request that can
  // never be valid (unknown process set, sender not a member); the caller reports it.
  common::Status add(Key key, const Request& request, int32_t rank,
                     std::chrono::steady_clock::time_point now);

  // Every response that is ready now, fused, in execution order.
  std::vector<Response> takeReady();

  // Names waiting longer than `older_than`, with the set ranks still missing: the stall report
  // ("Missing ranks:\n1: [allreduce.x, ...]"). Empty when nothing is stalled.
  std::string stallReport(std::chrono::seconds older_than) const;

  // Fails the names that can never complete (Note [Deadlock shutdown] in deadlock.cc): ranks
  // that wait only for ranks that wait themselves, all silent for `silent_for`. Their names
  // become error Responses (taken with takeReady) carrying the returned report; empty: none.
  std::string failDeadlocked(std::chrono::steady_clock::time_point now,
                             std::chrono::duration<double> silent_for);

  // Ranks of a set that are missing for a pending name (for the stuck-collective report).
  std::vector<int> missingRanks(Key key) const;

  // Calls mark for the key of every pending name (KeyTable::sweep).
  void markKeys(const KeyTable::MarkFn& mark) const;

 private:
  // One name waiting for the rest of its set, in the slot of its key's index. Storage is reused
  // from step to step, so the steady state copies requests without allocating.
  struct Pending {
    Key key;                        // unassigned: the slot is free
    std::vector<Request> requests;  // the first `count`, by arrival, one per submitting rank
    size_t count = 0;
    std::chrono::steady_clock::time_point first_seen;
    uint64_t sequence = 0;          // arrival order of the first request: release order
  };

  Pending* pendingFor(Key key);
  const Pending* pendingFor(Key key) const;
  common::Status addJoin(Key key, const Request& request, int32_t rank,
                         const ProcessSetInfo& set);
  bool hasJoined(int32_t set_id, int rank) const;
  bool submitted(const Pending& pending, int rank) const;
  bool isReady(const ProcessSetInfo& set, const Pending& pending) const;
  void release(const ProcessSetInfo& set, Pending& pending);
  void forgetSet(int32_t id);

  int world_size_;
  const KeyTable& keys_;
  int64_t fusion_threshold_ = 128ll << 20;
  uint64_t next_sequence_ = 0;
  std::map<int32_t, ProcessSetInfo> sets_;
  std::map<int32_t, std::vector<int>> joined_;  // set -> joined global ranks, in join order
  std::map<int32_t, Key> join_keys_;            // set -> its join's key, while joins wait
  std::vector<std::chrono::steady_clock::time_point> last_request_;  // by global rank
  std::vector<Pending> table_;                  // by key index
  size_t pending_count_ = 0;
  FusionBatch ready_;                           // released, fused as they are released
  ResponseCache cache_;
};

}  // namespace hvd::coord
