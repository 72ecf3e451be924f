// ResponseCache: rank 0's LRU of validated Responses per (process set, name). Only rank 0 holds
// one, so its contents need no agreement with any other rank: a hit returns exactly the Response
// that validation would build again from the same requests.
#include "coord/response_cache.h"

#include <algorithm>

namespace hvd::coord {

ResponseCache::ResponseCache(int64_t capacity) : capacity_(std::max<int64_t>(capacity, 0)) {}

void ResponseCache::setCapacity(int64_t capacity) {
  capacity_ = std::max<int64_t>(capacity, 0);
  entries_.clear();
  lru_.clear();
}

bool ResponseCache::cacheable(const Response& response) {
  return response.status == ResponseType::kOk && response.names.size() == 1 &&
         response.type != OpType::kBarrier && response.type != OpType::kJoin;
}

const Response* ResponseCache::find(int32_t set, const std::string& name,
                                    const std::vector<Request>& requests) {
  auto it = entries_.find(Key(set, name));
  if (it == entries_.end()) return nullptr;
  Entry& entry = it->second;
  if (entry.requests.size() != requests.size()) return nullptr;
  for (size_t i = 0; i < requests.size(); ++i) {
    if (entry.requests[i].request_rank != requests[i].request_rank ||
        !sameRequestParams(entry.requests[i], requests[i])) {
      return nullptr;
    }
  }
  lru_.splice(lru_.end(), lru_, entry.lru);
  return &entry.response;
}

void ResponseCache::put(int32_t set, const std::vector<Request>& requests,
                        const Response& response) {
  if (capacity_ == 0 || !cacheable(response)) return;
  Key key(set, response.names.front());
  auto it = entries_.find(key);
  if (it == entries_.end()) {
    if (static_cast<int64_t>(entries_.size()) >= capacity_) {
      entries_.erase(lru_.front());
      lru_.pop_front();
    }
    it = entries_.emplace(key, Entry{}).first;
    it->second.lru = lru_.insert(lru_.end(), key);
  } else {
    lru_.splice(lru_.end(), lru_, it->second.lru);
  }
  it->second.requests = requests;
  it->second.response = response;
}

void ResponseCache::eraseSet(int32_t set) {
  for (auto it = entries_.lower_bound(Key(set, std::string())); it != entries_.end() &&
       it->first.first == set;) {
    lru_.erase(it->second.lru);
    it = entries_.erase(it);
  }
}

}  // namespace hvd::coord
