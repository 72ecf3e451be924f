#include "runtime/device_output_pool.h"

#include <map>
#include <mutex>
#include <vector>

#include "common/logging.h"
#include "transport/nccl/loader.h"

namespace hvd::runtime {

namespace nccl = transport::nccl;
using common::Status;

// Note [Output reuse]: a block handed to a tensor comes back when the tensor's storage dies,
// with an event recorded then on the dropping thread's current stream — the stream PyTorch
// assumes a tensor is used on (its caching allocator makes the same assumption about a
// tensor's allocation stream; a tensor used on another stream needs record_stream there as
// well). The next op that takes the block makes its own stream wait on that event, so it
// writes only after everything queued before the drop has run: the host never waits. Blocks
// are powers of two, at least 64 KiB; at most kCachedBytes stay cached per device and a block
// past that is freed (cudaFree, which waits for the device: rare by construction).
namespace {

constexpr size_t kMinBlock = size_t{64} << 10;
constexpr size_t kCachedBytes = size_t{1} << 30;

size_t roundUp(size_t bytes) {
  size_t block = kMinBlock;
  while (block < bytes) block <<= 1;
  return block;
}

struct Block {
  void* memory = nullptr;
  size_t capacity = 0;
  nccl::CudaEvent released = nullptr;  // recorded on the last user's stream (may be null)
};

struct DevicePool {
  std::multimap<size_t, Block> cached;  // by capacity
  size_t cached_bytes = 0;
  size_t allocated = 0;
};

std::mutex g_mutex;
std::map<int, DevicePool>* g_pools = new std::map<int, DevicePool>();  // never destroyed

}  // namespace

DeviceOutputPool& DeviceOutputPool::instance() {
  static DeviceOutputPool* pool = new DeviceOutputPool();
  return *pool;
}

Status DeviceOutputPool::take(size_t bytes, nccl::DeviceStream& stream, void** block,
                              size_t* capacity) {
  const int device = stream.device();
  const size_t want = roundUp(bytes);
  Block found;
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    DevicePool& pool = (*g_pools)[device];
    auto it = pool.cached.find(want);
    if (it != pool.cached.end()) {
      found = it->second;
      pool.cached.erase(it);
      pool.cached_bytes -= found.capacity;
    }
  }
  const nccl::CudaApi* cuda = nccl::cudaApi();
  if (found.memory == nullptr) {
    HVD_RETURN_IF_ERROR(stream.check(cuda->malloc(&found.memory, want), "cudaMalloc"));
    found.capacity = want;
    std::lock_guard<std::mutex> lock(g_mutex);
    ++(*g_pools)[device].allocated;
  } else if (found.released != nullptr) {
    Status waited = stream.waitFor(found.released);
    cuda->eventDestroy(found.released);
    HVD_RETURN_IF_ERROR(waited);
  }
  *block = found.memory;
  *capacity = found.capacity;
  return Status::ok();
}

void DeviceOutputPool::give(int device, void* memory, size_t capacity, uintptr_t consumer) {
  const nccl::CudaApi* cuda = nccl::cudaApi();
  if (cuda == nullptr || memory == nullptr) return;
  Block block{memory, capacity, nullptr};
  int previous = -1;  // the event belongs to the block's device; this thread keeps its own
  const bool switched = cuda->getDevice(&previous) == nccl::kCudaSuccess && previous != device &&
                        cuda->setDevice(device) == nccl::kCudaSuccess;
  const bool recorded =
      cuda->eventCreateWithFlags(&block.released, nccl::kCudaEventDisableTiming) ==
          nccl::kCudaSuccess &&
      cuda->eventRecord(block.released, reinterpret_cast<nccl::CudaStream>(consumer)) ==
          nccl::kCudaSuccess;
  std::vector<Block> evicted;
  if (recorded) {
    std::lock_guard<std::mutex> lock(g_mutex);
    DevicePool& pool = (*g_pools)[device];
    pool.cached.emplace(capacity, block);
    pool.cached_bytes += capacity;
    while (pool.cached_bytes > kCachedBytes && !pool.cached.empty()) {
      auto largest = std::prev(pool.cached.end());
      evicted.push_back(largest->second);
      pool.cached_bytes -= largest->first;
      pool.cached.erase(largest);
    }
  } else {
    HVD_LOG(kWarning, "transport") << "could not order the reuse of a CUDA output block after "
                                   << "its last use; freeing it instead";
    evicted.push_back(block);
  }
  for (Block& b : evicted) {  // cudaFree waits for the device: the last users are done then
    if (b.released != nullptr) cuda->eventDestroy(b.released);
    cuda->free(b.memory);
  }
  if (switched) cuda->setDevice(previous);
}

size_t DeviceOutputPool::cachedBlocks(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return (*g_pools)[device].cached.size();
}

size_t DeviceOutputPool::allocatedBlocks(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return (*g_pools)[device].allocated;
}

}  // namespace hvd::runtime
