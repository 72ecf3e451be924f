// A worker's requests on their way to rank 0 (worker_requests.h).
#include "runtime/worker_requests.h"

namespace hvd::runtime {

WorkerRequests::WorkerRequests(const coord::KeyTable& keys, int64_t cache_capacity)
    : keys_(keys), cache_(cache_capacity) {}

std::string WorkerRequests::encode(EntryTable& entries) {
  encoding_.clear();
  for (coord::Key key : outgoing_) {
    const TensorEntry* entry = entries.find(key);
    if (entry != nullptr) encoding_.push_back(&entry->request);
  }
  outgoing_.clear();
  return coord::encodeRequests(encoding_.data(), encoding_.size(), &cache_, &keys_);
}

void WorkerRequests::markKeys(const coord::KeyTable::MarkFn& mark) const {
  for (coord::Key key : outgoing_) mark(key);
}

}  // namespace hvd::runtime
