#include "runtime/host_output_pool.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

#include "transport/shm/shared_blocks.h"

namespace hvd::runtime {

// Note [Host output reuse]: a block comes back when the last reference to its OutputBuffer
// dies (the caller's array or tensor over it); nothing reads or writes it after that, so the
// next op may take it at once: unlike device blocks (Note [Output reuse]) there is no stream
// to order against. Blocks are powers of two from 1 MiB, so a block fits every size up to
// twice smaller and a training loop's same-shaped outputs always find one; its pages stay
// mapped and faulted in. At most kCachedBytes stay cached, the largest freed first; only
// pages once written are resident, so a block larger than its use costs address space only.
// The block just given back is never the one freed: the bound is kCachedBytes or that block's
// size, whichever is larger, so an op whose output alone exceeds kCachedBytes (np=4, 64 MiB
// allgather: a 256 MiB block) still reuses it next time. Freeing it instead made every such
// op fault in and zero a fresh block: 696 ms per op against 21 ms at 16 MiB (issue #20).
namespace {

constexpr size_t kPooledMinBytes = size_t{1} << 20;
constexpr size_t kCachedBytes = size_t{256} << 20;

size_t roundUp(size_t bytes) {
  size_t block = kPooledMinBytes;
  while (block < bytes) block <<= 1;
  return block;
}

struct Pool {
  std::multimap<size_t, uint8_t*> cached;  // by capacity
  size_t cached_bytes = 0;
  uint8_t* (*allocate)(size_t capacity);
  void (*free)(uint8_t* block);
};

uint8_t* allocatePrivate(size_t capacity) {
  return static_cast<uint8_t*>(std::aligned_alloc(64, capacity));
}
void freePrivate(uint8_t* block) { std::free(block); }

std::mutex g_mutex;
// Never destroyed: outputs may die at interpreter exit.
Pool* g_private = new Pool{{}, 0, &allocatePrivate, &freePrivate};
Pool* g_shared = new Pool{{}, 0, &transport::shm::allocateSharedBlock,
                          &transport::shm::freeSharedBlock};

void giveBackTo(Pool* pool, OutputBuffer& buffer) {
  std::vector<uint8_t*> evicted;
  if (pool == g_shared && transport::shm::sharedBlockRetired(buffer.data)) {
    evicted.push_back(buffer.data);  // a peer may still write into it: never reused
  } else {
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto added = pool->cached.emplace(buffer.capacity, buffer.data);
    pool->cached_bytes += buffer.capacity;
    const size_t bound = std::max(kCachedBytes, buffer.capacity);
    while (pool->cached_bytes > bound) {  // largest first, never the block just added
      auto largest = std::prev(pool->cached.end());
      if (largest == added) --largest;  // the others sum to more than 0: one exists
      evicted.push_back(largest->second);
      pool->cached_bytes -= largest->first;
      pool->cached.erase(largest);
    }
  }
  for (uint8_t* block : evicted) pool->free(block);
}

void giveBackPrivate(OutputBuffer& buffer) { giveBackTo(g_private, buffer); }
void giveBackShared(OutputBuffer& buffer) { giveBackTo(g_shared, buffer); }

}  // namespace

std::shared_ptr<OutputBuffer> hostOutput(size_t bytes, bool shared) {
  if (bytes < kPooledMinBytes && !shared) return std::make_shared<OutputBuffer>(bytes);
  Pool* pool = shared ? g_shared : g_private;
  const size_t want = roundUp(bytes);
  uint8_t* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = pool->cached.find(want);
    if (it != pool->cached.end()) {
      data = it->second;
      pool->cached.erase(it);
      pool->cached_bytes -= want;
    }
  }
  if (data == nullptr) data = pool->allocate(want);
  if (data == nullptr && pool == g_shared) {  // at the live-block cap: cached blocks count too
    std::vector<uint8_t*> cached;
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      for (const auto& [capacity, block] : pool->cached) cached.push_back(block);
      pool->cached.clear();
      pool->cached_bytes = 0;
    }
    for (uint8_t* block : cached) pool->free(block);
    data = pool->allocate(want);
  }
  if (data == nullptr) return std::make_shared<OutputBuffer>(bytes);  // as before the pool
  return std::make_shared<OutputBuffer>(data, bytes, -1, want,
                                        shared ? &giveBackShared : &giveBackPrivate);
}

}  // namespace hvd::runtime
