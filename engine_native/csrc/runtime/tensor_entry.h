// TensorEntry: one enqueued op as the background thread sees it — the Request it negotiates and
// the caller's buffers it executes on. Created by a framework thread in Runtime::enqueue, owned
// by the background thread after submission. The Python caller keeps the buffers alive until
// the handle completes (Note [Handle lifetime] in handle_table.h).
// EntryTable: this rank's pending entries by key index (coord/key_table.h); slots keep their
// storage from step to step. Background thread only.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "coord/message.h"
#include "runtime/ready_events.h"

namespace hvd::runtime {

struct TensorEntry {
  coord::Request request;   // request.key: the name's key, held in flight while pending
  const void* input = nullptr;
  void* output = nullptr;   // allreduce / broadcast; others get an OutputBuffer
  size_t output_bytes = 0;  // a gather-like op's guessed output (Note [Output guesses])
  int64_t handle = 0;
  bool caller_waits = false;  // enqueued for an at-once wait (Note [One round] A)
  bool grouped = false;       // submitted with others at once (a group: fused by rank 0)
  std::chrono::steady_clock::time_point enqueued;  // when the loop took it (stall ages)
  uintptr_t stream = 0;  // CUDA tensors: the producer's stream (cudaStream_t), at enqueue
  ReadyEvent ready;      // recorded on that stream when the op is submitted
};

class EntryTable {
 public:
  // The pending entry of `key`, or nullptr.
  TensorEntry* find(coord::Key key) {
    if (key.index >= slots_.size() || !slots_[key.index].used ||
        slots_[key.index].entry.request.key != key) {
      return nullptr;
    }
    return &slots_[key.index].entry;
  }
  // Moves `entry` into its key's slot (a key is in flight at most once, so the slot is free).
  TensorEntry& put(TensorEntry&& entry) {
    const uint32_t index = entry.request.key.index;
    if (index >= slots_.size()) slots_.resize(std::max<size_t>(index + 1, slots_.size() * 2));
    Slot& slot = slots_[index];
    slot.entry = std::move(entry);
    slot.used = true;
    ++size_;
    return slot.entry;
  }
  bool contains(coord::Key key) const {
    return key.index < slots_.size() && slots_[key.index].used &&
           slots_[key.index].entry.request.key == key;
  }
  void erase(coord::Key key) {
    TensorEntry* entry = find(key);
    if (entry == nullptr) return;
    entry->ready.reset();  // an op that never ran on the device still holds its event
    slots_[key.index].used = false;
    --size_;
  }
  void clear() {
    for (Slot& slot : slots_) {
      if (slot.used) slot.entry.ready.reset();
      slot.used = false;
    }
    size_ = 0;
  }
  bool empty() const { return size_ == 0; }
  size_t size() const { return size_; }
  template <typename F>
  void forEach(F&& f) {
    if (size_ == 0) return;
    for (Slot& slot : slots_) {
      if (slot.used) f(slot.entry);
    }
  }

 private:
  struct Slot {
    TensorEntry entry;
    bool used = false;
  };
  std::vector<Slot> slots_;
  size_t size_ = 0;
};

}  // namespace hvd::runtime
