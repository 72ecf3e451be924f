#include "runtime/device_output_pool.h"

#include <map>
#include <mutex>

#include "common/logging.h"
#include "runtime/block_pool.h"
#include "transport/nccl/loader.h"

namespace hvd::runtime {

namespace nccl = transport::nccl;
using common::Status;

// Note [Output reuse]: a block handed to a tensor comes back when the tensor's storage dies,
// with an event recorded then on the dropping thread's current stream — the stream PyTorch
// assumes a tensor is used on (its caching allocator makes the same assumption about a
// tensor's allocation stream; a tensor used on another stream needs record_stream there as
// well). That event is the block's fence in its device's pool (Note [Block pool]): the next op
// that takes the block makes its own stream wait on it, so it writes only after everything
// queued before the drop has run: the host never waits. Size classes start at 64 KiB; at most
// kCachedBytes stay cached per device and a block past that is freed (cudaFree, which waits
// for the device: rare by construction).
namespace {

using DevicePool = BlockPool<nccl::CudaEvent>;

constexpr BlockPoolLimits kLimits{size_t{64} << 10, size_t{1} << 30,
                                  /*keep_returned_block=*/false};

// cudaFree waits for the device: the block's last users are done before it returns.
void freeBlock(DevicePool::Block& block) {
  const nccl::CudaApi* cuda = nccl::cudaApi();
  if (block.reuse_after != nullptr) cuda->eventDestroy(block.reuse_after);
  cuda->free(block.memory);
}

std::mutex g_mutex;
std::map<int, DevicePool>* g_pools = new std::map<int, DevicePool>();  // never destroyed

DevicePool& poolOf(int device) {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_pools->try_emplace(device, kLimits, &freeBlock).first->second;  // nodes never move
}

}  // namespace

DeviceOutputPool& DeviceOutputPool::instance() {
  static DeviceOutputPool* pool = new DeviceOutputPool();
  return *pool;
}

Status DeviceOutputPool::take(size_t bytes, nccl::DeviceStream& stream, void** block,
                              size_t* capacity) {
  const nccl::CudaApi* cuda = nccl::cudaApi();
  Status allocated;
  DevicePool::Block found = poolOf(stream.device()).take(bytes, [&](size_t want) -> void* {
    void* memory = nullptr;
    allocated = stream.check(cuda->malloc(&memory, want), "cudaMalloc");
    return allocated.isOk() ? memory : nullptr;
  });
  HVD_RETURN_IF_ERROR(allocated);
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
    poolOf(device).give(block);  // what it evicts is freed here, on the block's device
  } else {
    HVD_LOG(kWarning, "transport") << "could not order the reuse of a CUDA output block after "
                                   << "its last use; freeing it instead";
    freeBlock(block);
  }
  if (switched) cuda->setDevice(previous);
}

}  // namespace hvd::runtime
