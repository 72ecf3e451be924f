// WorkerRequests: a worker's requests not yet sent to rank 0, and its request cache, which
// turns a request seen before into a slot reference (coord/response_cache.h; rank 0 decodes
// against a mirror of it, RankZeroCoordinator). BackgroundLoop add()s drained entries and
// sends encode()'s bytes once a pass. Exists on workers only; background thread only
// (whichever thread holds the loop's progress_).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coord/key_table.h"
#include "coord/message.h"
#include "coord/response_cache.h"
#include "runtime/tensor_entry.h"

namespace hvd::runtime {

class WorkerRequests {
 public:
  // `keys` (the loop's) outlives this; cache_capacity: HVD_CACHE_CAPACITY.
  WorkerRequests(const coord::KeyTable& keys, int64_t cache_capacity);

  void add(coord::Key key) { outgoing_.push_back(key); }
  bool empty() const { return outgoing_.empty(); }
  // One kRequests payload for what was added and is still pending in `entries` (the rest
  // is dropped); nothing is left to send afterwards.
  std::string encode(EntryTable& entries);
  void markKeys(const coord::KeyTable::MarkFn& mark) const;

 private:
  const coord::KeyTable& keys_;
  std::vector<coord::Key> outgoing_;              // not yet sent to rank 0
  std::vector<const coord::Request*> encoding_;  // encode()'s scratch (storage reused)
  coord::RequestCache cache_;
};

}  // namespace hvd::runtime
