// Device point-to-point (runtime/device_peer_ops.h).
//
// Note [Device point-to-point]
//   A. Route. A CUDA tensor sent to a rank of this host (a shared-memory channel) travels by
//      CUDA IPC; to another host it is staged through host memory by the framework binding
//      (engine_native/torch/p2p_ops.py), as HVD_GPU_PATH=staged asks everywhere. There is no
//      NCCL path for point-to-point: between hosts the bytes cross the network through the
//      CPU either way.
//   B. Sender. At submission (the framework thread) an event is recorded on the producer's
//      stream (Horovod's stream contract). The loop then queues, on the core's point-to-point
//      stream of that device: wait for that event, copy the tensor into a StagingRing of
//      memory exported to that peer, record the room's interprocess event — and sends the
//      frame at once (kDevice: where, which event; transport/peer_frame.h), before the copy
//      ran: the receiver's stream waits for that event, on the device. The send completes
//      when its copy finished and its frame is written: the tensor is the caller's again,
//      and, as on the CPU, a send never waits for its receive.
//   C. The staging memory is a ring per (peer, device): rooms are reserved in order and
//      released when the receiver says it read them (kDeviceRead), in any order; the tail
//      moves past released rooms only. A message that finds no room gets a new segment (twice
//      the last, at least the message) instead of waiting for a receive, which could be a
//      deadlock (the receiver may want a later message first). Retired segments stay
//      allocated until exit, like every exported allocation (Note [IPC teardown] in
//      transport/cuda/ipc_peers.cc: CUDA leaves freeing memory a peer maps undefined, and
//      no barrier tells the sender the receiver closed it), so the staging memory is at most
//      about twice the most bytes ever in flight to that peer.
//   D. Receiver. A kDevice message waits like any other (Note [Point-to-point] B) until a
//      receive takes it. The receive names the device to read with: the result stays there
//      (on_device) or lands in host memory. The loop opens the sender's segment and event
//      (once each: IpcImports keeps them), queues on that device's stream a wait for the
//      event, and then: for a device result, a copy into an output from the core's device
//      pool (runtime/device_output_pool.h); for a host result, first only the wait (phase 1,
//      "gated"): a copy into pageable host memory returns when it finished, so it is issued
//      only once the sender's bytes are final, and the loop never blocks on another process's
//      kernels. The receive completes when its copy finished; then the kDeviceRead frame
//      goes back. A message whose sender's bytes cannot be read (no CUDA runtime, no device
//      named, an IPC failure: GPUs without peer access) fails that receive on this rank with
//      the reason, and is still released.
//   E. Order. Copies of one device's stream finish in queue order and are reported in that
//      order (a gated host read holds back the reads queued after it), so two messages of one
//      (peer, tag) still complete in the order sent.
//   F. Errors, never hangs. A copy that does not finish within HVD_TIMEOUT (its producer's
//      kernel never ends, or the sender died before its copy ran: a dead process's event never
//      fires) fails the rank: the stream is stuck and everything queued behind it with it. A
//      lost peer fails the rank as for host messages; abandon() then waits a bounded time for
//      the streams and forgets what was in flight.
#include "runtime/device_peer_ops.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"
#include "common/text.h"
#include "runtime/device_output_pool.h"
#include "runtime/host_output_pool.h"
#include "transport/nccl/loader.h"

namespace hvd::runtime {

using common::Status;
namespace nccl = transport::nccl;

namespace {

void giveBackOutput(OutputBuffer& buffer) {  // Note [Output reuse] in device_output_pool.cc
  DeviceOutputPool::instance().give(buffer.device, buffer.data, buffer.capacity,
                                    buffer.release_stream);
}

std::string seconds(double s) {
  common::Text os;
  os << s;
  return os.str();
}

}  // namespace

DevicePeerOps::DevicePeerOps(int wake_fd, double timeout_seconds)
    : wake_(wake_fd), timeout_(timeout_seconds) {}

DevicePeerOps::~DevicePeerOps() { drain(); }

Status DevicePeerOps::device(int ordinal, PerDevice** out) {
  const nccl::CudaApi* cuda = nccl::cudaApi();
  if (cuda == nullptr || !cuda->hasIpc()) {
    return common::internalError("this rank has no CUDA runtime with IPC loaded (a CUDA tensor "
                                 "between ranks of one host travels by CUDA IPC)");
  }
  PerDevice& d = devices_[ordinal];
  if (!d.stream) {
    auto stream = std::make_unique<nccl::DeviceStream>();
    HVD_RETURN_IF_ERROR(stream->init(ordinal));
    d.stream = std::move(stream);
  }
  HVD_RETURN_IF_ERROR(d.stream->select());
  *out = &d;
  return Status::ok();
}

Status DevicePeerOps::queueDone(Copy copy) {
  HVD_RETURN_IF_ERROR(copy.stream->record(&copy.done));
  copy.pooled = true;
  const Status woken = wake_.notifyAfter(*copy.stream);
  copy.since = std::chrono::steady_clock::now();
  copies_.push_back(std::move(copy));
  return woken;
}

Status DevicePeerOps::stage(int peer, int device_ordinal, nccl::CudaEvent ready,
                            const void* data, uint64_t bytes, uint64_t id,
                            const std::string& what, transport::DeviceMessage* message) {
  nccl::DeviceRestorer restore;
  PerDevice* d = nullptr;
  HVD_RETURN_IF_ERROR(device(device_ordinal, &d));
  auto& ring = d->rings[peer];
  if (!ring) ring = std::make_unique<transport::cuda::StagingRing>(*d->stream);
  message->sequence = next_sequence_[peer];
  uint8_t* dst = nullptr;
  nccl::CudaEvent event = nullptr;
  HVD_RETURN_IF_ERROR(ring->reserve(bytes, message, &dst, &event));
  ++next_sequence_[peer];
  Status status = ready != nullptr ? d->stream->waitFor(ready) : Status::ok();
  if (status.isOk()) status = d->stream->copy(dst, data, bytes);
  if (status.isOk()) {
    status = d->stream->check(nccl::cudaApi()->eventRecord(event, d->stream->stream()),
                              "cudaEventRecord(interprocess)");
  }
  if (!status.isOk()) {
    ring->release(message->sequence);  // no frame goes: nobody reads it
    return status;
  }
  Copy copy;
  copy.id = id;
  copy.what = what;
  copy.stream = d->stream.get();
  copy.done = event;  // the ring's: released with the room, not to the stream's pool
  copy.since = std::chrono::steady_clock::now();
  const Status woken = wake_.notifyAfter(*d->stream);
  copies_.push_back(std::move(copy));
  return woken;
}

void DevicePeerOps::released(int peer, uint64_t sequence) {
  for (auto& [ordinal, d] : devices_) {
    auto ring = d.rings.find(peer);
    if (ring != d.rings.end()) ring->second->release(sequence);
  }
}

Status DevicePeerOps::read(int peer, const transport::DeviceMessage& message, uint64_t bytes,
                           int device_ordinal, bool on_device, uint64_t id,
                           const std::string& what) {
  nccl::DeviceRestorer restore;
  PerDevice* d = nullptr;
  HVD_RETURN_IF_ERROR(device(device_ordinal, &d));
  auto& imports = d->imports[peer];
  if (!imports) imports = std::make_unique<transport::cuda::IpcImports>(*d->stream);
  const uint8_t* source = nullptr;
  nccl::CudaEvent written = nullptr;
  HVD_RETURN_IF_ERROR(imports->open(message, &source, &written));
  HVD_RETURN_IF_ERROR(d->stream->waitFor(written));
  Copy copy;
  copy.id = id;
  copy.what = what;
  copy.stream = d->stream.get();
  if (on_device) {
    void* block = nullptr;
    size_t capacity = 0;
    HVD_RETURN_IF_ERROR(DeviceOutputPool::instance().take(bytes, *d->stream, &block, &capacity));
    copy.output = std::make_shared<OutputBuffer>(static_cast<uint8_t*>(block), bytes,
                                                 device_ordinal, capacity, &giveBackOutput);
    HVD_RETURN_IF_ERROR(d->stream->copy(block, source, bytes));
  } else {
    copy.output = hostOutput(static_cast<size_t>(bytes));
    if (!copy.output || copy.output->data == nullptr) {
      return common::internalError(what + ": no host memory for " + std::to_string(bytes) +
                                   " bytes");
    }
    copy.gated = true;  // D: the copy out waits until the sender's bytes are final
    copy.source = source;
  }
  return queueDone(std::move(copy));
}

Status DevicePeerOps::copyOut(Copy& copy) {
  HVD_RETURN_IF_ERROR(copy.stream->select());
  copy.stream->release(copy.done);
  copy.done = nullptr;
  copy.gated = false;
  HVD_RETURN_IF_ERROR(copy.stream->copy(copy.output->data, copy.source, copy.output->bytes));
  HVD_RETURN_IF_ERROR(copy.stream->record(&copy.done));
  copy.since = std::chrono::steady_clock::now();
  return wake_.notifyAfter(*copy.stream);
}

Status DevicePeerOps::poll(std::vector<Done>* done) {
  if (copies_.empty()) return Status::ok();
  nccl::DeviceRestorer restore;
  const auto now = std::chrono::steady_clock::now();
  std::vector<const nccl::DeviceStream*> blocked;  // E: a stream whose oldest copy is not done
  for (auto it = copies_.begin(); it != copies_.end();) {
    Copy& copy = *it;
    const bool held_back =
        std::find(blocked.begin(), blocked.end(), copy.stream) != blocked.end();
    bool finished = false;
    if (!held_back) {
      HVD_RETURN_IF_ERROR(copy.stream->select());
      HVD_RETURN_IF_ERROR(copy.stream->query(copy.done, &finished));
    }
    if (finished && copy.gated) {
      HVD_RETURN_IF_ERROR(copyOut(copy));
      finished = false;
    }
    if (!finished) {
      if (now - copy.since > timeout_) {
        return common::timedOut(copy.what + ": its CUDA copy did not finish in " +
                                seconds(timeout_.count()) + " s (HVD_TIMEOUT): the kernel that "
                                "produces the tensor still runs, or its sender stopped");
      }
      if (!held_back) blocked.push_back(copy.stream);
      ++it;
      continue;
    }
    if (copy.pooled) copy.stream->release(copy.done);
    done->push_back(Done{copy.id, std::move(copy.output)});
    it = copies_.erase(it);
  }
  return Status::ok();
}

void DevicePeerOps::drain() {
  nccl::DeviceRestorer restore;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  for (auto& [ordinal, d] : devices_) {
    if (!d.stream || !d.stream->select().isOk()) continue;
    if (!d.stream->drain(deadline)) {
      HVD_LOG(kWarning, "transport") << "CUDA point-to-point: the stream of device " << ordinal
                                     << " still waits (a sender that died never signals); "
                                     << "the peers' mapped memory stays open until exit";
      for (auto& [peer, imports] : d.imports) imports.release();  // never closed under a copy
      continue;
    }
    for (auto& [peer, imports] : d.imports) {
      if (imports) imports->close();
    }
  }
}

void DevicePeerOps::abandon() {
  drain();
  copies_.clear();
}

}  // namespace hvd::runtime
