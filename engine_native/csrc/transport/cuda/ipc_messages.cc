// StagingRing and IpcImports (transport/cuda/ipc_messages.h).
#include "transport/cuda/ipc_messages.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/logging.h"
#include "transport/cuda/device_kernels.h"
#include "transport/nccl/loader.h"

namespace hvd::transport::cuda {

using common::Status;

namespace {

constexpr uint64_t kAlign = 256;             // cudaMalloc's alignment, kept for every message
constexpr uint64_t kFirstSegment = 1 << 20;  // then doubling, or the message's size

uint64_t aligned(uint64_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Segment ids are the process's (a receiver keys its mappings by them): two rings to one peer
// (two devices) never share one.
std::atomic<uint64_t> g_next_segment{1};

}  // namespace

StagingRing::~StagingRing() {
  if (!segments_.empty()) {
    HVD_LOG(kDebug, "transport") << "CUDA IPC: " << exportedBytes() << " bytes of point-to-point "
                                 << "staging stay allocated until exit (Note [IPC teardown])";
  }
}

uint64_t StagingRing::exportedBytes() const {
  uint64_t total = 0;
  for (const Segment& s : segments_) total += s.bytes;
  return total;
}

// The current segment is a ring: the live rooms are [tail, head) in reservation order (tail:
// the oldest room not yet released; head: the end of the newest), wrapping once.
bool StagingRing::place(uint64_t bytes, uint64_t* offset) const {
  if (segments_.empty()) return false;
  const Segment& current = segments_.back();
  const Held* oldest = nullptr;
  const Held* newest = nullptr;
  for (const Held& h : held_) {
    if (h.segment != current.id) continue;
    if (oldest == nullptr && !h.released) oldest = &h;
    newest = &h;
  }
  if (oldest == nullptr) {  // nothing live: the whole segment
    *offset = 0;
    return bytes <= current.bytes;
  }
  const uint64_t tail = oldest->begin, head = newest->end;
  if (head > tail) {  // [tail, head) live: room after head, else before tail
    if (current.bytes - head >= bytes) {
      *offset = head;
      return true;
    }
    *offset = 0;
    return tail >= bytes;
  }
  *offset = head;  // wrapped: live [tail, end) and [0, head)
  return tail - head >= bytes;
}

Status StagingRing::grow(uint64_t bytes) {
  const nccl::CudaApi* cuda = nccl::cudaApi();
  Segment s;
  s.bytes = std::max({bytes, kFirstSegment,
                      segments_.empty() ? uint64_t{0} : 2 * segments_.back().bytes});
  void* memory = nullptr;
  HVD_RETURN_IF_ERROR(stream_.check(cuda->malloc(&memory, s.bytes), "cudaMalloc"));
  s.memory = static_cast<uint8_t*>(memory);
  Status status = stream_.check(cuda->ipcGetMemHandle(&s.handle, memory), "cudaIpcGetMemHandle");
  const void* base = nullptr;
  if (status.isOk()) status = allocationBase(memory, &base);  // Note [IPC sub-allocation]
  if (!status.isOk()) {
    cuda->free(memory);  // never exported: no peer maps it
    return status;
  }
  s.base_offset = static_cast<uint64_t>(s.memory - static_cast<const uint8_t*>(base));
  s.id = g_next_segment.fetch_add(1);
  segments_.push_back(s);  // the old current one is retired: its rooms drain, it stays
  return Status::ok();
}

Status StagingRing::takeEvent(size_t* index) {
  for (size_t i = 0; i < events_.size(); ++i) {
    if (events_[i].free) {
      events_[i].free = false;
      *index = i;
      return Status::ok();
    }
  }
  const nccl::CudaApi* cuda = nccl::cudaApi();
  Event e;
  HVD_RETURN_IF_ERROR(stream_.check(
      cuda->eventCreateWithFlags(&e.event,
                                 nccl::kCudaEventInterprocess | nccl::kCudaEventDisableTiming),
      "cudaEventCreateWithFlags(interprocess)"));
  const Status status =
      stream_.check(cuda->ipcGetEventHandle(&e.handle, e.event), "cudaIpcGetEventHandle");
  if (!status.isOk()) {
    cuda->eventDestroy(e.event);  // never exported
    return status;
  }
  events_.push_back(e);
  *index = events_.size() - 1;
  return Status::ok();
}

Status StagingRing::reserve(uint64_t bytes, DeviceMessage* message, uint8_t** dst,
                            nccl::CudaEvent* event) {
  const uint64_t room = aligned(bytes);
  uint64_t offset = 0;
  if (!place(room, &offset)) {
    HVD_RETURN_IF_ERROR(grow(room));
    offset = 0;
  }
  size_t e = 0;
  HVD_RETURN_IF_ERROR(takeEvent(&e));
  const Segment& s = segments_.back();
  held_.push_back(Held{message->sequence, s.id, offset, offset + room, bytes, e});
  message->segment = s.id;
  message->segment_bytes = s.bytes;
  message->base_offset = s.base_offset;
  message->offset = offset;
  std::memcpy(message->memory, &s.handle, sizeof(message->memory));
  std::memcpy(message->event, &events_[e].handle, sizeof(message->event));
  *dst = s.memory + offset;
  *event = events_[e].event;
  return Status::ok();
}

void StagingRing::release(uint64_t sequence) {
  for (Held& h : held_) {
    if (h.sequence != sequence || h.released) continue;
    h.released = true;
    events_[h.event].free = true;
    break;
  }
  while (!held_.empty() && held_.front().released) held_.pop_front();
}

bool StagingRing::find(uint64_t sequence, const uint8_t** data, uint64_t* bytes) const {
  for (const Held& h : held_) {
    if (h.sequence != sequence || h.released) continue;
    for (const Segment& s : segments_) {
      if (s.id != h.segment) continue;
      *data = s.memory + h.begin;
      *bytes = h.bytes;
      return true;
    }
  }
  return false;
}

IpcImports::~IpcImports() { close(); }

Status IpcImports::open(const DeviceMessage& message, uint64_t bytes, const uint8_t** data,
                        nccl::CudaEvent* event) {
  const nccl::CudaApi* cuda = nccl::cudaApi();
  const std::string handle_bytes(message.memory, sizeof(message.memory));
  auto segment = segments_.find(message.segment);
  if (segment == segments_.end()) {
    nccl::CudaIpcHandle handle;
    std::memcpy(&handle, message.memory, sizeof(handle));
    Mapped m;
    m.handle = handle_bytes;
    HVD_RETURN_IF_ERROR(stream_.check(
        cuda->ipcOpenMemHandle(&m.base, handle, nccl::kCudaIpcMemLazyEnablePeerAccess),
        "cudaIpcOpenMemHandle"));
    const void* block = nullptr;
    size_t size = 0;
    const Status range = allocationRange(m.base, &block, &size);
    if (!range.isOk()) {
      cuda->ipcCloseMemHandle(m.base);
      return range;
    }
    m.bytes = size - static_cast<uint64_t>(static_cast<const uint8_t*>(m.base) -
                                           static_cast<const uint8_t*>(block));
    segment = segments_.emplace(message.segment, m).first;
  }
  const Mapped& m = segment->second;
  // base_offset <= 2^40 and offset + bytes <= segment_bytes (decodeDeviceMessage): no overflow.
  if (m.handle != handle_bytes || message.base_offset > m.bytes ||
      message.offset > m.bytes - message.base_offset ||
      bytes > m.bytes - message.base_offset - message.offset) {
    return common::internalError(
        "a device message names bytes outside the memory its sender exported (segment " +
        std::to_string(message.segment) + ", " + std::to_string(m.bytes) + " bytes mapped)");
  }
  const std::string key(message.event, sizeof(message.event));
  auto opened = events_.find(key);
  if (opened == events_.end()) {
    nccl::CudaIpcHandle handle;
    std::memcpy(&handle, message.event, sizeof(handle));
    nccl::CudaEvent e = nullptr;
    HVD_RETURN_IF_ERROR(stream_.check(cuda->ipcOpenEventHandle(&e, handle),
                                      "cudaIpcOpenEventHandle"));
    opened = events_.emplace(key, e).first;
  }
  *data = static_cast<const uint8_t*>(m.base) + message.base_offset + message.offset;
  *event = opened->second;
  return Status::ok();
}

void IpcImports::close() {
  const nccl::CudaApi* cuda = nccl::cudaApi();
  if (cuda == nullptr) return;
  for (const auto& [id, mapped] : segments_) cuda->ipcCloseMemHandle(mapped.base);
  for (const auto& [key, e] : events_) cuda->eventDestroy(e);
  segments_.clear();
  events_.clear();
}

}  // namespace hvd::transport::cuda
