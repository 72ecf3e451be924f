// KeyTable: records in fixed chunks (stable addresses) and an open-addressing index over them.
//
// Note [Key lifetime]
//   A. A record is filled under mutex_ by whoever first interns or acquires its name; its name
//      and set do not change until it is freed.
//   B. Only sweep() frees records, only on the background thread, and never one that is in
//      flight or that the background thread marks as referenced. Freeing moves the record's
//      generation on, so every copy of the old key stops being live() at once.
//   C. So the background thread may read name()/set() of a live key it holds without the lock:
//      nothing else can free that record meanwhile. Holders that need their keys to stay valid
//      (pending entries, requests waiting at the coordinator, queued responses) are marked by
//      the sweep; caches keep keys as hints and check live() before using one.
//   D. A key acquired by a submission stays in flight (its name taken) until its holder
//      releases it — the handle table, once the user has seen the op finish (Note [Name
//      lifetime] in runtime/handle_table.h) — or a failure releases every key. release() runs
//      on framework threads without mutex_: a record in flight is never freed (B), so the
//      generation check and the store cannot race a sweep; a release racing acquire() of the
//      same name leaves it either taken (the submitter sees a duplicate, as if it came first)
//      or free. releaseAll() frees names behind their holders' backs, so it is kept for a
//      failed core, which refuses every later submission: a holder's late release then finds
//      its name free or its key dead, never a new holder's.
#include "coord/key_table.h"

namespace hvd::coord {

KeyTable::KeyTable() : chunks_(new std::atomic<Record*>[kMaxChunks]), buckets_(64, 0) {
  for (uint32_t i = 0; i < kMaxChunks; ++i) chunks_[i].store(nullptr, std::memory_order_relaxed);
}

KeyTable::~KeyTable() {
  for (uint32_t i = 0; i < kMaxChunks; ++i) delete[] chunks_[i].load(std::memory_order_relaxed);
}

uint64_t KeyTable::hashOf(int32_t set, std::string_view name) {
  uint64_t h = std::hash<std::string_view>()(name);
  return h ^ (static_cast<uint64_t>(static_cast<uint32_t>(set)) * 0x9e3779b97f4a7c15ull);
}

size_t KeyTable::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return live_;
}

uint32_t KeyTable::findLocked(int32_t set, std::string_view name, uint64_t hash) const {
  const size_t mask = buckets_.size() - 1;
  for (size_t i = hash & mask; buckets_[i] != 0; i = (i + 1) & mask) {
    const uint32_t index = buckets_[i] - 1;
    const Record& r = record(index);
    if (r.hash == hash && r.set == set && r.name == name) return index;
  }
  return Key::kNoIndex;
}

uint32_t KeyTable::allocateLocked() {
  if (free_head_ != Key::kNoIndex) {
    const uint32_t index = free_head_;
    free_head_ = record(index).next_free;
    return index;
  }
  const uint32_t index = limit_.load(std::memory_order_relaxed);
  const uint32_t chunk = index >> kChunkBits;
  if (chunk >= kMaxChunks) return Key::kNoIndex;
  if (chunks_[chunk].load(std::memory_order_relaxed) == nullptr) {
    chunks_[chunk].store(new Record[kChunkSize], std::memory_order_release);
  }
  limit_.store(index + 1, std::memory_order_release);
  return index;
}

void KeyTable::growIndexLocked() {
  std::vector<uint32_t> old(buckets_.size() * 2, 0);
  old.swap(buckets_);
  const size_t mask = buckets_.size() - 1;
  for (uint32_t entry : old) {
    if (entry == 0) continue;
    size_t i = record(entry - 1).hash & mask;
    while (buckets_[i] != 0) i = (i + 1) & mask;
    buckets_[i] = entry;
  }
}

void KeyTable::insertIndexLocked(uint32_t index) {
  if ((live_ + 1) * 2 > buckets_.size()) growIndexLocked();
  const size_t mask = buckets_.size() - 1;
  size_t i = record(index).hash & mask;
  while (buckets_[i] != 0) i = (i + 1) & mask;
  buckets_[i] = index + 1;
}

// Backward-shift deletion: later entries of the probe run move up, so no tombstones remain.
void KeyTable::eraseIndexLocked(uint32_t index) {
  const size_t mask = buckets_.size() - 1;
  size_t hole = record(index).hash & mask;
  while (buckets_[hole] != index + 1) hole = (hole + 1) & mask;
  for (size_t j = (hole + 1) & mask; buckets_[j] != 0; j = (j + 1) & mask) {
    const size_t home = record(buckets_[j] - 1).hash & mask;
    // Entry j may fill the hole unless its home lies cyclically in (hole, j].
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (stays) continue;
    buckets_[hole] = buckets_[j];
    hole = j;
  }
  buckets_[hole] = 0;
}

Key KeyTable::internLocked(int32_t set, std::string_view name) {
  const uint64_t hash = hashOf(set, name);
  uint32_t index = findLocked(set, name, hash);
  if (index == Key::kNoIndex) {
    index = allocateLocked();
    if (index == Key::kNoIndex) return Key();
    Record& r = record(index);
    r.name.assign(name.data(), name.size());
    r.set = set;
    r.hash = hash;
    r.used = true;
    r.in_flight.store(false, std::memory_order_relaxed);
    insertIndexLocked(index);
    ++live_;
    created_since_sweep_.fetch_add(1, std::memory_order_relaxed);
  }
  return Key{index, record(index).generation.load(std::memory_order_relaxed)};
}

KeyTable::Acquired KeyTable::acquire(int32_t set, std::string_view name, Key* key) {
  std::lock_guard<std::mutex> lock(mutex_);
  Key k = internLocked(set, name);
  if (!k.assigned()) return Acquired::kFull;
  Record& r = record(k.index);
  if (r.in_flight.load(std::memory_order_acquire)) return Acquired::kInFlight;
  r.in_flight.store(true, std::memory_order_relaxed);
  *key = k;
  return Acquired::kOk;
}

void KeyTable::release(const Key* keys, size_t count) {
  for (size_t i = 0; i < count; ++i) {  // Note [Key lifetime] D: no lock
    if (!live(keys[i])) continue;
    record(keys[i].index).in_flight.store(false, std::memory_order_release);
  }
}

void KeyTable::releaseAll() {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t limit = limit_.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < limit; ++i) {
    record(i).in_flight.store(false, std::memory_order_relaxed);
  }
}

Key KeyTable::intern(int32_t set, std::string_view name) {
  std::lock_guard<std::mutex> lock(mutex_);
  return internLocked(set, name);
}

Key KeyTable::find(int32_t set, std::string_view name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t index = findLocked(set, name, hashOf(set, name));
  if (index == Key::kNoIndex) return Key();
  return Key{index, record(index).generation.load(std::memory_order_relaxed)};
}

size_t KeyTable::sweep(const std::function<void(const MarkFn&)>& mark_live) {
  std::lock_guard<std::mutex> lock(mutex_);
  const uint32_t epoch = ++sweep_epoch_;
  const uint32_t limit = limit_.load(std::memory_order_relaxed);
  mark_live([this, epoch, limit](Key k) {
    if (k.index < limit && record(k.index).generation.load(std::memory_order_relaxed) ==
                               k.generation) {
      record(k.index).mark = epoch;
    }
  });
  size_t freed = 0;
  for (uint32_t i = 0; i < limit; ++i) {
    Record& r = record(i);
    if (!r.used || r.in_flight.load(std::memory_order_acquire) || r.mark == epoch) continue;
    eraseIndexLocked(i);
    r.used = false;
    r.name.clear();
    r.generation.fetch_add(1, std::memory_order_release);  // Note [Key lifetime] B
    r.next_free = free_head_;
    free_head_ = i;
    --live_;
    ++freed;
  }
  live_after_sweep_ = live_;
  created_since_sweep_.store(0, std::memory_order_relaxed);
  return freed;
}

}  // namespace hvd::coord
