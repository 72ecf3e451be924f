#include "runtime/process_sets.h"

#include <numeric>

namespace hvd::runtime {

void ProcessSetTable::reset(int world_size) {
  std::lock_guard<std::mutex> lock(mutex_);
  sets_.clear();
  std::vector<int> all(world_size);
  std::iota(all.begin(), all.end(), 0);
  sets_[0] = all;
  next_id_ = 1;
  ++version_;
}

int32_t ProcessSetTable::add(std::vector<int> ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  int32_t id = next_id_++;
  sets_[id] = std::move(ranks);
  ++version_;
  return id;
}

bool ProcessSetTable::remove(int32_t id) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (id == 0 || sets_.erase(id) == 0) return false;
  ++version_;
  return true;
}

std::optional<std::vector<int>> ProcessSetTable::members(int32_t id) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return std::nullopt;
  return it->second;
}

ProcessSetTable::Membership ProcessSetTable::membership(int32_t id, int rank, int root) const {
  std::lock_guard<std::mutex> lock(mutex_);
  Membership out;
  auto it = sets_.find(id);
  if (it == sets_.end()) return out;
  out.registered = true;
  out.size = static_cast<int>(it->second.size());
  for (int r : it->second) {
    out.has_rank = out.has_rank || r == rank;
    out.has_root = out.has_root || r == root;
  }
  return out;
}

bool ProcessSetTable::contains(int32_t id, int rank) const {
  std::lock_guard<std::mutex> lock(mutex_);
  auto it = sets_.find(id);
  if (it == sets_.end()) return false;
  for (int r : it->second) {
    if (r == rank) return true;
  }
  return false;
}

std::map<int32_t, std::vector<int>> ProcessSetTable::snapshot() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return sets_;
}

uint64_t ProcessSetTable::version() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return version_;
}

}  // namespace hvd::runtime
