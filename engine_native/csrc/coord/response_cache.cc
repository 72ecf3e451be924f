// ResponseCache: rank 0's LRU of validated Responses per key. Only rank 0 holds one, so its
// contents need no agreement with any other rank: a hit returns exactly the Response that
// validation would build again from the same requests. Entries are reused in place, so a hit
// or an overwrite in the steady state allocates nothing.
#include "coord/response_cache.h"

#include <algorithm>

namespace hvd::coord {

ResponseCache::ResponseCache(int64_t capacity) : capacity_(std::max<int64_t>(capacity, 0)) {}

void ResponseCache::setCapacity(int64_t capacity) {
  capacity_ = std::max<int64_t>(capacity, 0);
  entries_.clear();
  entry_of_index_.clear();
  lru_.clear();
  used_ = 0;
}

bool ResponseCache::cacheable(const Response& response) {
  return response.status == ResponseType::kOk && response.keys.size() == 1 &&
         response.type != OpType::kBarrier && response.type != OpType::kJoin;
}

const Response* ResponseCache::find(Key key, const Request* requests, size_t count) {
  if (key.index >= entry_of_index_.size() || entry_of_index_[key.index] < 0) return nullptr;
  Entry& entry = entries_[static_cast<size_t>(entry_of_index_[key.index])];
  if (entry.key != key || entry.requests.size() != count) return nullptr;
  for (size_t i = 0; i < count; ++i) {
    if (entry.requests[i].request_rank != requests[i].request_rank ||
        !sameRequestParams(entry.requests[i], requests[i])) {
      return nullptr;
    }
  }
  lru_.splice(lru_.end(), lru_, entry.lru);
  return &entry.response;
}

void ResponseCache::put(Key key, const Request* requests, size_t count,
                        const Response& response) {
  if (capacity_ == 0 || !cacheable(response)) return;
  if (key.index >= entry_of_index_.size()) entry_of_index_.resize(key.index + 1, -1);
  int32_t slot = entry_of_index_[key.index];
  if (slot >= 0 && entries_[static_cast<size_t>(slot)].key != key) slot = -1;  // stale hint
  if (slot < 0) {
    if (static_cast<int64_t>(used_) < capacity_) {
      slot = static_cast<int32_t>(entries_.size());
      entries_.emplace_back();
      entries_.back().lru = lru_.insert(lru_.end(), static_cast<uint32_t>(slot));
      ++used_;
    } else {
      slot = static_cast<int32_t>(lru_.front());  // evict the least recently used
      Key old = entries_[static_cast<size_t>(slot)].key;
      if (old.assigned() && entry_of_index_[old.index] == slot) entry_of_index_[old.index] = -1;
    }
    entry_of_index_[key.index] = slot;
  }
  Entry& entry = entries_[static_cast<size_t>(slot)];
  lru_.splice(lru_.end(), lru_, entry.lru);
  entry.key = key;
  entry.requests.assign(requests, requests + count);
  entry.response = response;
}

void ResponseCache::eraseSet(int32_t set) {
  for (auto& entry : entries_) {
    if (entry.key.assigned() && entry.response.process_set == set) {
      if (entry_of_index_[entry.key.index] >= 0 &&
          entries_[static_cast<size_t>(entry_of_index_[entry.key.index])].key == entry.key) {
        entry_of_index_[entry.key.index] = -1;
      }
      entry.key = Key();  // stays in the LRU order; reused like any other entry
    }
  }
}

}  // namespace hvd::coord
