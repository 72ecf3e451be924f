// SpscRing<T>: a fixed-capacity, lock-free single-producer/single-consumer ring of POD slots.
// Owned by Timeline: the background thread is the only producer, the timeline writer thread
// the only consumer. A producer fills several slots and publishes them with one commit(), so
// the consumer never sees half of a multi-slot record group. Nothing here blocks or allocates.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace hvd::timeline {

template <typename T>
class SpscRing {
  static_assert(std::is_trivially_copyable<T>::value, "ring slots are copied as plain bytes");

 public:
  // capacity is rounded up to a power of two (at least 2).
  explicit SpscRing(size_t capacity) {
    size_t c = 2;
    while (c < capacity) c <<= 1;
    slots_.resize(c);
    mask_ = c - 1;
  }

  size_t capacity() const { return slots_.size(); }

  // ---- producer side --------------------------------------------------------------------
  // Slots the producer may fill now. Re-reads the consumer's position only when the cached
  // one says the ring looks too full, so the common case touches no shared cache line.
  size_t freeSlots(size_t wanted) {
    uint64_t head = head_.load(std::memory_order_relaxed);
    if (capacity() - (head - cached_tail_) < wanted) {
      cached_tail_ = tail_.load(std::memory_order_acquire);
    }
    return capacity() - (head - cached_tail_);
  }
  // The i-th unpublished slot after the producer's position (i < freeSlots()).
  T& producerSlot(size_t i) {
    return slots_[(head_.load(std::memory_order_relaxed) + i) & mask_];
  }
  // Publishes the first n filled slots to the consumer.
  void commit(size_t n) {
    head_.store(head_.load(std::memory_order_relaxed) + n, std::memory_order_release);
  }

  // ---- consumer side --------------------------------------------------------------------
  size_t readable() const {
    return head_.load(std::memory_order_acquire) - tail_.load(std::memory_order_relaxed);
  }
  const T& consumerSlot(size_t i) const {
    return slots_[(tail_.load(std::memory_order_relaxed) + i) & mask_];
  }
  void release(size_t n) {
    tail_.store(tail_.load(std::memory_order_relaxed) + n, std::memory_order_release);
  }

 private:
  std::vector<T> slots_;
  size_t mask_ = 0;
  alignas(64) std::atomic<uint64_t> head_{0};  // written by the producer only
  uint64_t cached_tail_ = 0;                   // producer's last view of tail_
  alignas(64) std::atomic<uint64_t> tail_{0};  // written by the consumer only
};

}  // namespace hvd::timeline
