#include "runtime/host_output_pool.h"

#include <cstdlib>

#include "runtime/block_pool.h"
#include "transport/shm/shared_blocks.h"

namespace hvd::runtime {

// Note [Host output reuse]: a block comes back when the last reference to its OutputBuffer
// dies (the caller's array or tensor over it); nothing reads or writes it after that, so the
// next op may take it at once: unlike device blocks (Note [Output reuse]) there is no stream
// to order against, and the pool's fence is empty. Blocks are size classes from 1 MiB (Note
// [Block pool]); their pages stay mapped and faulted in. At most kCachedBytes stay cached;
// only pages once written are resident, so a block larger than its use costs address space
// only. The block just given back is never the one freed, so an op whose output alone exceeds
// kCachedBytes (np=4, 64 MiB allgather: a 256 MiB block) still reuses it next time. Freeing it
// instead made every such op fault in and zero a fresh block: 696 ms per op against 21 ms at
// 16 MiB (issue #20).
namespace {

struct NoFence {};
using HostPool = BlockPool<NoFence>;

constexpr BlockPoolLimits kLimits{size_t{1} << 20, size_t{256} << 20,
                                  /*keep_returned_block=*/true};

void* allocatePrivate(size_t capacity) { return std::aligned_alloc(64, capacity); }
void freePrivate(HostPool::Block& block) { std::free(block.memory); }
void* allocateShared(size_t capacity) { return transport::shm::allocateSharedBlock(capacity); }
void freeShared(HostPool::Block& block) {
  transport::shm::freeSharedBlock(static_cast<uint8_t*>(block.memory));
}

// Never destroyed: outputs may die at interpreter exit.
HostPool* g_private = new HostPool(kLimits, &freePrivate);
HostPool* g_shared = new HostPool(kLimits, &freeShared);

void giveBackPrivate(OutputBuffer& buffer) { g_private->give({buffer.data, buffer.capacity}); }

void giveBackShared(OutputBuffer& buffer) {
  HostPool::Block block{buffer.data, buffer.capacity};
  if (transport::shm::sharedBlockRetired(buffer.data)) {
    freeShared(block);  // a peer may still write into it: never reused
  } else {
    g_shared->give(block);
  }
}

}  // namespace

std::shared_ptr<OutputBuffer> hostOutput(size_t bytes, bool shared) {
  if (bytes < kLimits.min_block && !shared) return std::make_shared<OutputBuffer>(bytes);
  HostPool& pool = shared ? *g_shared : *g_private;
  void* (*allocate)(size_t) = shared ? &allocateShared : &allocatePrivate;
  HostPool::Block block = pool.take(bytes, allocate);
  if (block.memory == nullptr && shared) {  // at the live-block cap: cached blocks count too
    pool.freeCached();
    block = pool.take(bytes, allocate);
  }
  if (block.memory == nullptr) return std::make_shared<OutputBuffer>(bytes);  // as before the pool
  return std::make_shared<OutputBuffer>(static_cast<uint8_t*>(block.memory), bytes, -1,
                                        block.capacity,
                                        shared ? &giveBackShared : &giveBackPrivate);
}

}  // namespace hvd::runtime
