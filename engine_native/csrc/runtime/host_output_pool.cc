#include "runtime/host_output_pool.h"

#include <cstdlib>
#include <map>
#include <mutex>

namespace hvd::runtime {

// Note [Host output reuse]: a block comes back when the last reference to its OutputBuffer
// dies (the caller's array or tensor over it); nothing reads or writes it after that, so the
// next op may take it at once: unlike device blocks (Note [Output reuse]) there is no stream
// to order against. Blocks are powers of two from 1 MiB, so a block fits every size up to
// twice smaller and a training loop's same-shaped outputs always find one; its pages stay
// mapped and faulted in. At most kCachedBytes stay cached, the largest freed first; only
// pages once written are resident, so a block larger than its use costs address space only.
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
  uint8_t* evicted = nullptr;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_pool->cached.emplace(buffer.capacity, buffer.data);
    g_pool->cached_bytes += buffer.capacity;
    if (g_pool->cached_bytes > kCachedBytes) {
      auto largest = std::prev(g_pool->cached.end());
      evicted = largest->second;
      g_pool->cached_bytes -= largest->first;
      g_pool->cached.erase(largest);
    }
  }
  std::free(evicted);  // the largest is at least the block added: one eviction restores the bound
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
