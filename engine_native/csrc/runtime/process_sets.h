// ProcessSetTable: id -> member global ranks, shared by framework threads (add/remove/lookup)
// and the background thread (execution, negotiation). Set 0 is the global set. Ids come from a
// counter, so every rank must add sets in the same order (the Python layer checks agreement
// with an allgather before registering). Thread-safe; version() lets the loop notice changes.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <vector>

namespace hvd::runtime {

class ProcessSetTable {
 public:
  void reset(int world_size);
  int32_t add(std::vector<int> ranks);
  bool remove(int32_t id);
  std::optional<std::vector<int>> members(int32_t id) const;
  // What enqueue() checks, without copying the member list.
  struct Membership {
    bool registered = false;
    bool has_rank = false;  // `rank` is a member
    bool has_root = false;  // `root` is a member
    int size = 0;
  };
  Membership membership(int32_t id, int rank, int root) const;
  // True when `rank` is a member of set `id` (false for an unknown set).
  bool contains(int32_t id, int rank) const;
  std::map<int32_t, std::vector<int>> snapshot() const;
  uint64_t version() const;

 private:
  mutable std::mutex mutex_;
  std::map<int32_t, std::vector<int>> sets_;
  int32_t next_id_ = 1;
  uint64_t version_ = 0;
};

}  // namespace hvd::runtime
