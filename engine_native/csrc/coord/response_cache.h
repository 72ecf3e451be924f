// The negotiation fast path. RequestCache: a per-sender LRU of recent requests, so a worker sends
// a repeated request as a few-byte slot reference instead of name + shape + parameters; each
// worker owns one for its sends and rank 0 owns a mirror per worker (see Note [Request cache
// mirror]). ResponseCache: rank 0's validated Responses per (process set, name), so a name
// whose requests repeat exactly skips validation. Background thread only; not thread-safe.
#pragma once

#include <cstdint>
#include <functional>
#include <list>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/status.h"
#include "coord/message.h"

namespace hvd::coord {

// Note [Request cache mirror]
// A RequestCache's state is a pure function of the sequence of requests its sender encoded:
// encodeRequests and decodeRequests apply the same step for every cacheable request, in list
// order — on a hit, mark the slot most recently used; on a miss, store the request (replacing
// the entry with the same name, else filling the next free slot, else evicting the least
// recently used slot). So the worker's cache and rank 0's mirror for that worker stay identical
// provided that:
//  (a) both are built with the same capacity (HVD_CACHE_CAPACITY is equal on every rank);
//  (b) rank 0 decodes every list the worker encoded, exactly once, in send order (the control
//      channel is reliable and ordered, and nothing else touches either cache);
//  (c) a decode failure ends that worker's session: a half-applied list leaves the mirror
//      out of step, so the runtime drops the peer rather than continuing.
// Only the sender's own sequence matters: other ranks, readiness and responses play no part,
// which is what makes the pair safe without any cross-rank agreement.

// True when a and b agree in every field except name, key, request_rank and group_id (callers
// match the name first; rank and group are per call and a slot reference carries them).
// Doubles compare by value.
bool sameRequestParams(const Request& a, const Request& b);

class RequestCache {
 public:
  // At most `capacity` entries (clamped to [0, kMaxCapacity]); 0 disables caching.
  explicit RequestCache(int64_t capacity);
  static constexpr int64_t kMaxCapacity = int64_t{1} << 20;
  // Move-only: slots hold iterators into lru_, which a move keeps valid and a copy would not.
  RequestCache(const RequestCache&) = delete;
  RequestCache& operator=(const RequestCache&) = delete;
  RequestCache(RequestCache&&) = default;
  RequestCache& operator=(RequestCache&&) = default;

  int64_t capacity() const { return capacity_; }
  size_t size() const { return by_name_.size(); }
  // Barrier and join are never cached: they carry no parameters worth saving.
  static bool cacheable(const Request& r);

  // `name` is r's tensor name (a local request carries only its key).
  int32_t find(const Request& r, const std::string& name) const;  // slot of an equal request
  const Request* at(uint32_t slot) const;    // nullptr when out of range or empty
  // The holder's key for a slot's name (rank 0's mirrors: a hint, checked with
  // KeyTable::live before use); reset whenever the slot takes another request.
  Key* keyHint(uint32_t slot) { return slot < slots_.size() ? &slots_[slot].key_hint : nullptr; }
  void touch(int32_t slot);                  // mark most recently used
  int32_t insert(const Request& r, const std::string& name);  // the miss step; returns the slot

 private:
  struct Slot {
    Request request;
    std::list<int32_t>::iterator lru;  // slots are filled in order and never emptied
    Key key_hint;
  };
  int64_t capacity_;
  std::vector<Slot> slots_;
  std::list<int32_t> lru_;                            // front = least recently used
  std::unordered_map<std::string, int32_t> by_name_;
};

// Encodes requests as a RequestList; with a cache, requests already in it go as slot references
// and the others are added to it (Note [Request cache mirror]). nullptr = every request in full
// form. Requests without a name are named by their key in `keys`.
std::string encodeRequests(const Request* const* requests, size_t count,
                           RequestCache* sender_cache, const KeyTable* keys = nullptr);
// Decodes what encodeRequests produced, replaying the same steps on `mirror` (nullptr = the
// sender used no cache; a slot reference is then malformed), and hands each request to `visit`
// as it is read: the decoded or cached Request (valid during the call only), the sender's rank
// and group id as sent, and the mirror slot's key hint (nullptr when not cached). kInternal on
// malformed input; requests before the malformed one have been visited.
using RequestVisitor =
    std::function<void(const Request& request, int32_t rank, int32_t group_id, Key* hint)>;
common::Status decodeRequests(const std::string& bytes, RequestCache* mirror,
                              const RequestVisitor& visit);
// The same into a list of copies (tests, tools).
common::Status decodeRequests(const std::string& bytes, RequestCache* mirror, RequestList* out);

// Rank 0's validated Responses, LRU by key (process set, name). An entry remembers the requests
// it was built from (one per set rank, ascending) and is reused only when all of them repeat.
// Keys are hints here: an entry whose key is no longer live simply misses.
class ResponseCache {
 public:
  explicit ResponseCache(int64_t capacity = 1024);
  ResponseCache(const ResponseCache&) = delete;
  ResponseCache& operator=(const ResponseCache&) = delete;

  void setCapacity(int64_t capacity);  // 0 disables; clears the cache
  size_t size() const { return used_; }
  // Only successful, non-barrier, non-join responses for a single name are worth keeping.
  static bool cacheable(const Response& response);

  // The cached Response for `key` when `requests` match its own; marks it recently used.
  const Response* find(Key key, const Request* requests, size_t count);
  void put(Key key, const Request* requests, size_t count, const Response& response);
  void eraseSet(int32_t set);

 private:
  struct Entry {
    Key key;                        // unassigned: free
    std::vector<Request> requests;  // storage reused when the entry is overwritten
    Response response;
    std::list<uint32_t>::iterator lru;
  };
  int64_t capacity_;
  size_t used_ = 0;
  std::vector<Entry> entries_;
  std::vector<int32_t> entry_of_index_;  // key index -> entry, -1 when none
  std::list<uint32_t> lru_;              // entries, front = least recently used
};

}  // namespace hvd::coord
