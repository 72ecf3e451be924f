// RequestCache and the cache-aware RequestList encoding (Note [Request cache mirror]).
// Layout: u8 kRequestListTag, u32 count, then per request a u8 form:
//   kFull: every Request field (wire::writeRequest), ~60 bytes + name + shape;
//   kSlot: u32 slot, i32 request_rank, i32 group_id — 13 bytes whatever the name and shape.
#include <algorithm>
#include <limits>

#include "coord/response_cache.h"
#include "coord/wire.h"

namespace hvd::coord {

namespace {
constexpr uint8_t kFull = 0;
constexpr uint8_t kSlot = 1;
constexpr size_t kMinEntryBytes = 13;  // the slot form; the full form is longer
constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
}  // namespace

bool sameRequestParams(const Request& a, const Request& b) {
  return a.type == b.type && a.dtype == b.dtype && a.shape == b.shape &&
         a.reduce_op == b.reduce_op && a.prescale == b.prescale && a.postscale == b.postscale &&
         a.root_rank == b.root_rank && a.process_set == b.process_set && a.device == b.device &&
         a.splits == b.splits;
}

RequestCache::RequestCache(int64_t capacity)
    : capacity_(std::clamp<int64_t>(capacity, 0, kMaxCapacity)) {}

bool RequestCache::cacheable(const Request& r) {
  return r.type != OpType::kBarrier && r.type != OpType::kJoin;
}

int32_t RequestCache::find(const Request& r, const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return -1;
  return sameRequestParams(slots_[it->second].request, r) ? it->second : -1;
}

const Request* RequestCache::at(uint32_t slot) const {
  return slot < slots_.size() ? &slots_[slot].request : nullptr;
}

void RequestCache::touch(int32_t slot) {
  lru_.splice(lru_.end(), lru_, slots_[slot].lru);
}

int32_t RequestCache::insert(const Request& r, const std::string& name) {
  if (capacity_ == 0) return -1;
  int32_t slot = -1;
  auto it = by_name_.find(name);
  if (it != by_name_.end()) {
    slot = it->second;                                   // same name, new parameters
  } else if (static_cast<int64_t>(slots_.size()) < capacity_) {
    slot = static_cast<int32_t>(slots_.size());          // next free slot
    slots_.push_back(Slot{r, lru_.insert(lru_.end(), slot), Key()});
  } else {
    slot = lru_.front();                                 // evict the least recently used
    by_name_.erase(slots_[slot].request.name);
  }
  by_name_[name] = slot;
  slots_[slot].request = r;
  slots_[slot].request.name = name;
  slots_[slot].key_hint = Key();
  touch(slot);
  return slot;
}

std::string encodeRequests(const Request* const* requests, size_t count,
                           RequestCache* sender_cache, const KeyTable* keys) {
  std::string out;
  out.reserve(8 + 16 * count);
  common::ByteWriter w(&out);
  w.u8(wire::kRequestListTag);
  w.u32(static_cast<uint32_t>(count));
  for (size_t i = 0; i < count; ++i) {
    const Request& r = *requests[i];
    // A local request names its tensor by key only; one from elsewhere carries the name.
    const std::string& name = r.name.empty() && keys != nullptr ? keys->name(r.key) : r.name;
    bool use_cache = sender_cache != nullptr && RequestCache::cacheable(r);
    int32_t slot = use_cache ? sender_cache->find(r, name) : -1;
    if (slot >= 0) {
      w.u8(kSlot);
      w.u32(static_cast<uint32_t>(slot));
      w.i32(r.request_rank);
      w.i32(r.group_id);
      sender_cache->touch(slot);
      continue;
    }
    w.u8(kFull);
    wire::writeRequest(w, r, name);
    if (use_cache) sender_cache->insert(r, name);
  }
  return out;
}

namespace {

// One entry of a request list, replaying the sender's cache step on `mirror`, handed to visit.
bool readEntry(common::ByteReader& in, RequestCache* mirror, Request* scratch,
               const RequestVisitor& visit) {
  uint8_t form = 0;
  if (!in.u8(&form)) return false;
  if (form == kFull) {
    if (!wire::readRequest(in, scratch)) return false;
    Key* hint = nullptr;
    if (mirror != nullptr && RequestCache::cacheable(*scratch)) {
      const int32_t slot = mirror->insert(*scratch, scratch->name);  // -1: caching is off
      if (slot >= 0) hint = mirror->keyHint(static_cast<uint32_t>(slot));
    }
    visit(*scratch, scratch->request_rank, scratch->group_id, hint);
    return true;
  }
  if (form != kSlot) return in.fail("unknown request form " + std::to_string(form));
  uint32_t slot = 0;
  int32_t rank = 0, group = 0;
  if (!in.u32(&slot) || !in.ranged(&rank, 0, kInt32Max, "request_rank") ||
      !in.ranged(&group, -1, kInt32Max, "group id")) {
    return false;
  }
  if (mirror == nullptr) return in.fail("cache slot reference but caching is off");
  const Request* cached = mirror->at(slot);
  if (cached == nullptr) return in.fail("cache slot " + std::to_string(slot) + " is empty");
  mirror->touch(static_cast<int32_t>(slot));
  visit(*cached, rank, group, mirror->keyHint(slot));
  return true;
}

}  // namespace

common::Status decodeRequests(const std::string& bytes, RequestCache* mirror,
                              const RequestVisitor& visit) {
  common::ByteReader in(bytes);
  uint8_t tag = 0;
  uint32_t n = 0;
  bool ok = in.u8(&tag) && (tag == wire::kRequestListTag || in.fail("not a RequestList")) &&
            in.count(&n, kMinEntryBytes);
  Request scratch;
  for (uint32_t i = 0; ok && i < n; ++i) ok = readEntry(in, mirror, &scratch, visit);
  if (ok && !in.atEnd()) ok = in.fail("trailing bytes");
  if (!ok) return common::internalError("malformed RequestList: " + in.error());
  return common::Status::ok();
}

common::Status decodeRequests(const std::string& bytes, RequestCache* mirror, RequestList* out) {
  std::vector<Request> requests;  // grown as entries parse: a lying count allocates nothing
  common::Status status = decodeRequests(
      bytes, mirror, [&requests](const Request& r, int32_t rank, int32_t group, Key*) {
        requests.push_back(r);
        requests.back().request_rank = rank;
        requests.back().group_id = group;
      });
  if (status.isOk()) out->requests = std::move(requests);
  return status;
}

}  // namespace hvd::coord
