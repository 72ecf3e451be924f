#include "runtime/device_output_pool.h"

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "common/test_switch.h"
#include "runtime/block_pool.h"
#include "transport/nccl/loader.h"
#include "transport/nccl/ordered_memory.h"

namespace hvd::runtime {

namespace nccl = transport::nccl;
using common::Status;

// Note [Output reuse]: a block handed to a tensor comes back when the tensor's storage dies, with
// an event recorded then on the buffer's release_stream — the stream current when the binding
// wrapped it, which PyTorch assumes a tensor is used on (its caching allocator makes the same
// assumption about a tensor's allocation stream). A tensor used on another stream must have that
// stream synchronised with the wrapping one before it is dropped, or be cloned: record_stream does
// nothing for memory torch's allocator did not allocate. A stream named so (a
// torch.cuda.ExternalStream) must outlive the tensor. That event is the block's fence in its
// device's pool (Note [Block pool]): the next op that takes the block makes its own stream wait on
// it, so it writes only after everything queued before the drop has run: the host never waits. Size
// classes start at 64 KiB; at most 1 GiB (cachedBytesBound()) stays cached per device. A block past
// that is not freed by the dropping thread (which has no stream of the core's, and may hold the
// GIL): it waits in its device's `evicted` list until the next take() on that device, which orders
// the free after the block's fence on the op's stream (Note [Ordered device memory]). Fresh blocks
// come from the same allocator on the op's stream; one that fails for lack of memory first frees
// every cached block, which the framework's allocator may need as much as this op does.
namespace {

using DevicePool = BlockPool<nccl::CudaEvent>;

size_t cachedBytesBound() {
  const char* forced = HVD_TEST_SWITCH("DEVICE_OUTPUT_CACHE_BYTES");  // tests: evict at once
  return forced != nullptr ? static_cast<size_t>(std::strtoull(forced, nullptr, 10))
                           : size_t{1} << 30;
}

// One device's blocks: the cache, and what it evicted, still to be freed on an op's stream.
class DeviceBlocks {
 public:
  DeviceBlocks()
      : cache_({size_t{64} << 10, cachedBytesBound(), /*keep_returned_block=*/false},
               [this](DevicePool::Block& block) { evict(block); }) {}

  DevicePool& cache() { return cache_; }

  // Frees the evicted blocks after their last use: `stream` waits for each fence first.
  Status freeEvicted(nccl::DeviceStream& stream) {
    std::vector<DevicePool::Block> blocks;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks.swap(evicted_);
    }
    const nccl::CudaApi* cuda = nccl::cudaApi();
    Status status;
    for (DevicePool::Block& block : blocks) {
      Status freed = stream.waitFor(block.reuse_after);
      cuda->eventDestroy(block.reuse_after);
      if (freed.isOk()) {
        freed = stream.check(nccl::freeOrdered(*cuda, stream.stream(), block.memory),
                             "cudaFreeAsync/cudaFree");
      }
      if (status.isOk()) status = freed;  // a block not freed is leaked, never freed early
    }
    return status;
  }

 private:
  void evict(DevicePool::Block& block) {
    std::lock_guard<std::mutex> lock(mutex_);
    evicted_.push_back(block);
  }

  DevicePool cache_;
  std::mutex mutex_;
  std::vector<DevicePool::Block> evicted_;
};

std::mutex g_mutex;
std::map<int, DeviceBlocks>* g_devices = new std::map<int, DeviceBlocks>();  // never destroyed

DeviceBlocks& blocksOf(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return (*g_devices)[device];  // nodes never move
}

}  // namespace

DeviceOutputPool& DeviceOutputPool::instance() {
  static DeviceOutputPool* pool = new DeviceOutputPool();
  return *pool;
}

Status DeviceOutputPool::take(size_t bytes, nccl::DeviceStream& stream, void** block,
                              size_t* capacity) {
  const nccl::CudaApi* cuda = nccl::cudaApi();
  DeviceBlocks& blocks = blocksOf(stream.device());
  HVD_RETURN_IF_ERROR(blocks.freeEvicted(stream));
  int error = nccl::kCudaSuccess;
  auto allocate = [&](size_t want) -> void* {
    void* memory = nullptr;
    error = nccl::allocateOrdered(*cuda, stream.stream(), want, &memory);
    return error == nccl::kCudaSuccess ? memory : nullptr;
  };
  DevicePool::Block found = blocks.cache().take(bytes, allocate);
  if (error == nccl::kCudaErrorMemoryAllocation) {  // give the cache back, then try once more
    blocks.cache().freeCached();
    HVD_RETURN_IF_ERROR(blocks.freeEvicted(stream));
    found = blocks.cache().take(bytes, allocate);
  }
  if (error == nccl::kCudaErrorMemoryAllocation) {
    return common::internalError(
        "CUDA device " + std::to_string(stream.device()) + " has no " + std::to_string(bytes) +
        " bytes left for a collective's output, even with the core's cached outputs freed: "
        "release memory the framework caches (torch.cuda.empty_cache()) or use smaller tensors");
  }
  HVD_RETURN_IF_ERROR(stream.check(error, "cudaMallocAsync/cudaMalloc"));
  if (found.reuse_after != nullptr) {
    Status waited = stream.waitFor(found.reuse_after);
    cuda->eventDestroy(found.reuse_after);
    HVD_RETURN_IF_ERROR(waited);
  }
  *block = found.memory;
  *capacity = found.capacity;
  return Status::ok();
}

void DeviceOutputPool::give(int device, void* memory, size_t capacity, uintptr_t consumer) {
  const nccl::CudaApi* cuda = nccl::cudaApi();
  if (cuda == nullptr || memory == nullptr) return;
  DevicePool::Block block{memory, capacity, nullptr};
  int previous = -1;  // the event belongs to the block's device; this thread keeps its own
  const bool switched = cuda->getDevice(&previous) == nccl::kCudaSuccess && previous != device &&
                        cuda->setDevice(device) == nccl::kCudaSuccess;
  const bool recorded =
      cuda->eventCreateWithFlags(&block.reuse_after, nccl::kCudaEventDisableTiming) ==
          nccl::kCudaSuccess &&
      cuda->eventRecord(block.reuse_after, reinterpret_cast<nccl::CudaStream>(consumer)) ==
          nccl::kCudaSuccess;
  if (recorded) {
    blocksOf(device).cache().give(block);  // what it evicts waits for the next take()
  } else {
    HVD_LOG(kWarning, "transport") << "could not order the reuse of a CUDA output block after "
                                   << "its last use; freeing it with cudaFree, which waits for "
                                   << "the whole device";
    if (block.reuse_after != nullptr) cuda->eventDestroy(block.reuse_after);
    cuda->free(block.memory);
  }
  if (switched) cuda->setDevice(previous);
}

std::shared_ptr<OutputBuffer> pooledDeviceOutput(void* block, size_t bytes, int device,
                                                 size_t capacity) {
  return std::make_shared<OutputBuffer>(
      static_cast<uint8_t*>(block), bytes, device, capacity, [](OutputBuffer& buffer) {
        DeviceOutputPool::instance().give(buffer.device, buffer.data, buffer.capacity,
                                          buffer.release_stream);
      });
}

void keepUntilExit(std::shared_ptr<OutputBuffer> output) {
  if (!output) return;
  static std::mutex mutex;
  static auto* kept = new std::vector<std::shared_ptr<OutputBuffer>>();  // never destroyed
  std::lock_guard<std::mutex> lock(mutex);
  kept->push_back(std::move(output));
}

}  // namespace hvd::runtime
