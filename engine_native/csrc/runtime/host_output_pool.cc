#include "runtime/host_output_pool.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <vector>

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
};

std::mutex g_mutex;
Pool* g_pool = new Pool();  // never destroyed: outputs may die at interpreter exit

void giveBack(OutputBuffer& buffer) {
  std::vector<uint8_t*> evicted;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    const auto added = g_pool->cached.emplace(buffer.capacity, buffer.data);
    g_pool->cached_bytes += buffer.capacity;
    const size_t bound = std::max(kCachedBytes, buffer.capacity);
    while (g_pool->cached_bytes > bound) {  // largest first, never the block just added
      auto largest = std::prev(g_pool->cached.end());
      if (largest == added) --largest;  // the others sum to more than 0: one exists
      evicted.push_back(largest->second);
      g_pool->cached_bytes -= largest->first;
      g_pool->cached.erase(largest);
    }
  }
  for (uint8_t* block : evicted) std::free(block);
}

}  // namespace

std::shared_ptr<OutputBuffer> hostOutput(size_t bytes) {
  if (bytes < kPooledMinBytes) return std::make_shared<OutputBuffer>(bytes);
  const size_t want = roundUp(bytes);
  uint8_t* data = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    auto it = g_pool->cached.find(want);
    if (it != g_pool->cached.end()) {
      data = it->second;
      g_pool->cached.erase(it);
      g_pool->cached_bytes -= want;
    }
  }
  if (data == nullptr) data = static_cast<uint8_t*>(std::aligned_alloc(64, want));
  if (data == nullptr) return std::make_shared<OutputBuffer>(bytes);  // as before the pool
  return std::make_shared<OutputBuffer>(data, bytes, -1, want, &giveBack);
}

}  // namespace hvd::runtime
