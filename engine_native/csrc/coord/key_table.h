// KeyTable: interns (process set, tensor name) pairs as small integer Keys, so per-tensor state
// lives in index-addressed slots and steady-state training steps compare integers, not strings.
// Framework threads acquire() a key when they submit (that is also the duplicate-name check)
// and release it when the user has seen the op finish (Note [Name lifetime] in
// runtime/handle_table.h); the background thread resolves names arriving on the wire and
// sweep()s records nothing refers to any more. Note [Key lifetime] in key_table.cc.
#pragma once

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace hvd::coord {

// A key is valid for as long as its record's generation is unchanged (a freed record's
// generation moves on, so stale copies are recognised, never confused with the next name).
struct Key {
  static constexpr uint32_t kNoIndex = 0xffffffffu;
  uint32_t index = kNoIndex;
  uint32_t generation = 0;
  bool assigned() const { return index != kNoIndex; }
  friend bool operator==(Key a, Key b) {
    return a.index == b.index && a.generation == b.generation;
  }
  friend bool operator!=(Key a, Key b) { return !(a == b); }
};

class KeyTable {
 public:
  KeyTable();
  ~KeyTable();
  KeyTable(const KeyTable&) = delete;
  KeyTable& operator=(const KeyTable&) = delete;

  // Any thread. The key of (set, name), marked in flight: kInFlight when that name is already
  // in flight in that set (the caller reports the duplicate), kFull past kMaxChunks chunks.
  enum class Acquired { kOk, kInFlight, kFull };
  Acquired acquire(int32_t set, std::string_view name, Key* key);
  // Any thread, without the lock (Note [Key lifetime] D): the holder of these keys is done with
  // them (the user saw the op finish, or a submission was rolled back); their names may be
  // submitted again. A key that is no longer live is ignored.
  void release(const Key* keys, size_t count);
  void releaseAll();

  // Background thread, names from the wire. find: unassigned Key when unknown.
  Key intern(int32_t set, std::string_view name);
  Key find(int32_t set, std::string_view name) const;
  // Several lookups under one lock (a decoded message's names).
  class Batch {
   public:
    explicit Batch(KeyTable& table) : table_(table), lock_(table.mutex_) {}
    Key intern(int32_t set, std::string_view name) { return table_.internLocked(set, name); }
   private:
    KeyTable& table_;
    std::lock_guard<std::mutex> lock_;
  };

  // Lock-free reads of a live key (Note [Key lifetime] C): the background thread, or a thread
  // that holds the key in flight.
  const std::string& name(Key key) const { return record(key.index).name; }
  int32_t set(Key key) const { return record(key.index).set; }
  bool live(Key key) const {
    return key.index < limit_.load(std::memory_order_acquire) &&
           record(key.index).generation.load(std::memory_order_acquire) == key.generation;
  }
  // Exclusive upper bound of every index handed out so far: size for index-addressed arrays.
  uint32_t indexLimit() const { return limit_.load(std::memory_order_acquire); }
  size_t size() const;

  // Background thread. True when enough records were created since the last sweep that one is
  // worth its cost (amortised O(1) per created record).
  bool wantsSweep() const { return created_since_sweep_.load(std::memory_order_relaxed) >
                                   std::max<size_t>(kMinSweep, live_after_sweep_); }
  // Frees every record that is not in flight and that `mark_live` does not mark; mark_live is
  // called once with a function to call for each key still referenced. Returns the count freed.
  using MarkFn = std::function<void(Key)>;
  size_t sweep(const std::function<void(const MarkFn&)>& mark_live);

 private:
  struct Record {
    std::string name;
    int32_t set = 0;
    uint64_t hash = 0;
    std::atomic<uint32_t> generation{1};
    bool used = false;        // holds a name (else on the free list)
    std::atomic<bool> in_flight{false};  // taken: acquire() refuses the name (Note D)
    uint32_t mark = 0;        // sweep epoch that marked it
    uint32_t next_free = Key::kNoIndex;
  };
  static constexpr uint32_t kChunkBits = 10;
  static constexpr uint32_t kChunkSize = 1u << kChunkBits;
  static constexpr uint32_t kMaxChunks = 1u << 12;  // 4 Mi names alive at once
  static constexpr size_t kMinSweep = 4096;

  Record& record(uint32_t index) const {
    return chunks_[index >> kChunkBits].load(std::memory_order_acquire)[index & (kChunkSize - 1)];
  }
  static uint64_t hashOf(int32_t set, std::string_view name);
  uint32_t findLocked(int32_t set, std::string_view name, uint64_t hash) const;
  Key internLocked(int32_t set, std::string_view name);
  uint32_t allocateLocked();
  void insertIndexLocked(uint32_t index);
  void eraseIndexLocked(uint32_t index);
  void growIndexLocked();

  mutable std::mutex mutex_;
  std::unique_ptr<std::atomic<Record*>[]> chunks_;  // stable records: readers need no lock
  std::atomic<uint32_t> limit_{0};
  uint32_t free_head_ = Key::kNoIndex;
  size_t live_ = 0;
  std::atomic<size_t> created_since_sweep_{0};
  size_t live_after_sweep_ = 0;
  uint32_t sweep_epoch_ = 0;
  // Open addressing, linear probing: record index + 1 per bucket (0 = empty).
  std::vector<uint32_t> buckets_;
};

}  // namespace hvd::coord
