// InternTable: the timeline recorder's string -> dense id table (Note [Interned strings] in
// timeline.cc). Used by the recording thread only, on every recording call, so it is built for
// the lookup: open addressing with linear probing over a power-of-two slot array that doubles
// at half load, FNV-1a hashes, the text kept in a deque so slots can point at it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

namespace hvd::timeline {

class InternTable {
 public:
  static constexpr uint32_t kAbsent = 0xffffffffu;

  static uint64_t hash(std::string_view text) {
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : text) h = (h ^ c) * 1099511628211ull;
    return h;
  }

  // The id of `text` (hashed with hash()), or kAbsent.
  uint32_t find(std::string_view text, uint64_t h) const {
    if (slots_.empty()) return kAbsent;
    for (size_t i = h & mask_;; i = (i + 1) & mask_) {
      const Slot& s = slots_[i];
      if (s.id == kAbsent) return kAbsent;
      if (s.hash == h && s.size == text.size() &&
          std::memcmp(s.data, text.data(), text.size()) == 0) {
        return s.id;
      }
    }
  }

  // Adds `text` (not present) under the next id, which it returns.
  uint32_t add(std::string_view text, uint64_t h) {
    if (2 * (storage_.size() + 1) > slots_.size()) grow();
    storage_.emplace_back(text);
    const uint32_t id = static_cast<uint32_t>(storage_.size() - 1);
    place(Slot{h, storage_.back().data(), static_cast<uint32_t>(text.size()), id});
    return id;
  }

  size_t size() const { return storage_.size(); }
  // The text of an id that find() or add() returned; valid until clear().
  std::string_view text(uint32_t id) const { return storage_[id]; }

  void clear() {
    storage_.clear();
    slots_.assign(slots_.size(), Slot());
  }

 private:
  struct Slot {
    uint64_t hash = 0;
    const char* data = nullptr;
    uint32_t size = 0;
    uint32_t id = kAbsent;
  };

  void place(const Slot& slot) {
    size_t i = slot.hash & mask_;
    while (slots_[i].id != kAbsent) i = (i + 1) & mask_;
    slots_[i] = slot;
  }

  void grow() {
    std::vector<Slot> old;
    old.swap(slots_);
    slots_.assign(old.empty() ? 1024 : 2 * old.size(), Slot());
    mask_ = slots_.size() - 1;
    for (const Slot& s : old) {
      if (s.id != kAbsent) place(s);
    }
  }

  std::deque<std::string> storage_;  // id -> text; deque: slots point into it
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

}  // namespace hvd::timeline
