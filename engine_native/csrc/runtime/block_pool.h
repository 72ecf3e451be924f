// BlockPool: blocks of memory for the outputs the core allocates, cached when their last user
// gives them back and handed to a later op of the same size class instead of a fresh
// allocation. One mechanism for every kind of memory (Note [Block pool]); its users say where
// blocks come from and what a given-back block waits for: runtime/host_output_pool.cc (host
// memory, waits for nothing) and runtime/device_output_pool.cc (device memory, waits for a
// CUDA event). Locked: blocks are taken by the background loop and given back by any thread.
#pragma once

#include <algorithm>
#include <cstddef>
#include <functional>
#include <iterator>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

namespace hvd::runtime {

// Note [Block pool]: block sizes are powers of two from a minimum, so a block fits every size
// up to twice smaller and a training loop's same-shaped outputs always find one. A block given
// back is cached with its fence, the proof of its last use that a taker must wait for before
// writing (Note [Output reuse] for device blocks; host blocks have none: Note [Host output
// reuse]). At most a bound of bytes stay cached; past it the largest cached blocks are freed
// first. Blocks are allocated and freed outside the lock: either may take long (a fresh
// mapping faults in, cudaFree waits for the device).
struct BlockPoolLimits {
  size_t min_block = 0;     // the smallest size class
  size_t cached_bytes = 0;  // bound on the bytes of cached blocks
  // Whether the block just given back is never the one freed (the bound is then cached_bytes
  // or its size, whichever is larger): an op whose output alone exceeds the bound still
  // reuses its block next time.
  bool keep_returned_block = false;
};

// Fence: what a given-back block waits for before reuse; a value-initialised Fence means
// nothing. The pool only carries it: the taker waits for it and owns it from then on.
template <typename Fence>
class BlockPool {
 public:
  struct Block {
    void* memory = nullptr;
    size_t capacity = 0;  // the size class
    Fence reuse_after{};
  };
  // Frees a block the pool evicts, its fence included (or hands it to what will).
  using FreeFn = std::function<void(Block& block)>;

  BlockPool(BlockPoolLimits limits, FreeFn free) : limits_(limits), free_(std::move(free)) {}
  BlockPool(const BlockPool&) = delete;
  BlockPool& operator=(const BlockPool&) = delete;

  // A cached block of the size class of `bytes` (its reuse_after still to be waited for), or a
  // fresh one from allocate(capacity) (void* on success, nullptr when refused: then the
  // returned block's memory is nullptr).
  template <typename Allocate>
  Block take(size_t bytes, Allocate&& allocate) {
    const size_t want = sizeClass(bytes);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = cached_.find(want);
      if (it != cached_.end()) {
        Block found = std::move(it->second);
        cached_.erase(it);
        cached_bytes_ -= want;
        return found;
      }
    }
    Block fresh;
    fresh.memory = allocate(want);
    fresh.capacity = want;
    return fresh;
  }

  // Caches a block taken from this pool, its last use fenced by block.reuse_after, and frees
  // what the bound leaves no room for.
  void give(Block block) {
    std::vector<Block> evicted;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const size_t capacity = block.capacity;
      const auto added = cached_.emplace(capacity, std::move(block));
      cached_bytes_ += capacity;
      const size_t bound = limits_.keep_returned_block
                               ? std::max(limits_.cached_bytes, capacity)
                               : limits_.cached_bytes;
      while (cached_bytes_ > bound) {  // more than 0 bytes cached: a block exists
        auto largest = std::prev(cached_.end());
        // Kept, the added block leaves the others summing to more than 0: one exists.
        if (limits_.keep_returned_block && largest == added) --largest;
        cached_bytes_ -= largest->first;
        evicted.push_back(std::move(largest->second));
        cached_.erase(largest);
      }
    }
    for (Block& b : evicted) free_(b);
  }

  // Frees every cached block (an allocator at its cap counts cached blocks as live).
  void freeCached() {
    std::multimap<size_t, Block> cached;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cached.swap(cached_);
      cached_bytes_ = 0;
    }
    for (auto& [capacity, block] : cached) free_(block);
  }

 private:
  size_t sizeClass(size_t bytes) const {
    size_t block = limits_.min_block;
    while (block < bytes) block <<= 1;
    return block;
  }

  const BlockPoolLimits limits_;
  const FreeFn free_;
  std::mutex mutex_;
  std::multimap<size_t, Block> cached_;  // by capacity
  size_t cached_bytes_ = 0;
};

}  // namespace hvd::runtime
