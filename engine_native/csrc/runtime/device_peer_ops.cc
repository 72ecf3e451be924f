// Device point-to-point (runtime/device_peer_ops.h).
//
// Note [Device point-to-point]
//   A. Route (PeerOps::cudaRoute). With the CUDA runtime and NCCL 2.14+ loaded, a CUDA tensor
//      to a rank of another host, or to any rank under HVD_GPU_PATH=nccl, goes by NCCL
//      ncclSend/ncclRecv (Note [NCCL point-to-point] in device_nccl_peers.cc). Otherwise one
//      sent to a rank of this host (a shared-memory channel) travels by CUDA IPC, as this Note
//      says; one to another host is staged through host memory by the framework binding
//      (engine_native/torch/p2p_ops.py), as HVD_GPU_PATH=staged asks everywhere.
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
//      (once each: IpcImports keeps them, and checks every later message against what was
//      mapped), queues on that device's stream a wait for the event, and then: for a device
//      result, a copy into an output from the core's device pool
//      (runtime/device_output_pool.h); for a host result, first only the wait (phase 1,
//      "gated"). A copy into pageable host memory returns only when it ran, and so waits for
//      whatever its stream queued before it; so it is issued once the sender's bytes are
//      final (phase 2), on the device's stream that holds only such copies (HostCopyStreams,
//      shared with NCCL point-to-point's): the loop blocks for the copy itself, never on
//      another process's kernels. The receive completes when
//      its copy finished; then the kDeviceRead frame goes back. A message whose bytes cannot
//      be read goes by G.
//   E. Order. Messages are matched to receives in the order sent (Note [Point-to-point] B);
//      their copies may finish in another order (different devices, a gated host result),
//      so receives complete when their own copy did, as irecv handles may anywhere.
//   F. Errors, never hangs. A copy that does not finish within HVD_TIMEOUT (its producer's
//      kernel never ends, or the sender died before its copy ran: a dead process's event never
//      fires) fails the rank: the stream is stuck and everything queued behind it with it. The
//      time counts from when it was queued or, once a copy ahead of it on its stream finished,
//      from then: a copy waiting its turn behind work that moves is not stuck (I lets a rank
//      queue far ahead). A
//      lost peer fails the rank as for host messages; abandon() then waits a bounded time for
//      the streams and forgets what was in flight — except, when a stream did not drain, the
//      outputs its copies may still write, which are kept until exit rather than reused.
//   G. Refusal. The sender cannot know whether the receiver can map its memory (that depends
//      on the receive's device: two GPUs without peer access, no CUDA runtime or device on
//      the receiving rank, an IPC failure). A receiver that cannot read a message answers
//      kDeviceRefused instead of kDeviceRead and keeps the receive open; the sender, whose
//      bytes still sit in the message's room, copies them into host memory (the same gated
//      host copy as D) and sends them as kDeviceResend, then releases the room; the receive
//      completes with them (a host result, moved to its device by the binding). From the
//      first refusal on, cudaRoute says "staged" for that peer, so the binding stages later
//      CUDA tensors to it itself. Both ranks log it once.
//   H. Completion. A copy tells the loop it finished by a host function queued after it (an
//      eventfd write, Note [Deferred completion] in device_executor.cc), except the copy of
//      the op a driving caller waits on — its blocking send's staging copy, or its blocking
//      receive's read onto the device — which asks for no wake: that caller polls its event,
//      as it does a collective's (Note [Caller waits on the device] F there), and writes what
//      the completion queued (the read's receipt: PeerOps::pollDevice), or the sender's room
//      would wait for the loop's next pass. A host function costs a driver callback and holds
//      back whatever the stream queues next (the same rank's next hand-off) until it ran; a
//      pipeline stage's blocking hand-off paid two a hop. A read handed over to its consumer's
//      stream (I) has no caller polling it: it asks for the wake.
//   I. Stream-ordered receives. A receive of a result on the device whose caller waits for it
//      at once may name the stream that consumes it (`consumer`; the pipeline's receives pass
//      torch's current stream where HVD_PIPELINE_STREAM_RECV=1). It then
//      completes once its copy is queued, not once it ran: the core's stream waits for the
//      sender's event and copies into a pooled output as in D, and the consumer's stream waits
//      (on the device) for that copy. The kernels its caller queues next on that stream read
//      the message, and its thread goes on queueing them instead of waiting for the sender's
//      kernels: a pipeline stage on a GPU otherwise waited for its neighbour's device work at
//      every hand-off, with nothing new queued on its own device meanwhile (benchmarks/
//      RESULTS.md, "GPU: one H100, 2026-12-06": the pipeline's excess over the stages alone).
//      As with torch.distributed's NCCL receive, the bytes are final in that stream's order
//      only. The copy's entry keeps the block until it ran (the caller may drop the tensor
//      sooner) and wakes the loop as any other copy; its completion only sends the receipt, so
//      the sender's room is freed a little later than the receive completed (its ring may take
//      one segment more); dropped, the block is fenced on the consumer's stream. The rank's
//      later copies on the core's stream queue behind it, as they would behind the caller's
//      wait: the stream keeps the order in which this rank asked, and the consumer's wait is
//      queued while its caller waits (so nothing it queues later comes before it), so a
//      single-threaded schedule that does not deadlock with blocking receives does not here
//      either; other threads queueing on the same stream, or the legacy default stream's
//      implicit synchronisation, are outside that argument. What it costs, and why it is not
//      the default: a copy that never finishes (its sender died first) still fails the rank
//      within HVD_TIMEOUT (F), and the rank's next core op raises, but the consumer's stream
//      now waits on that copy too, for good: a synchronisation of it (`.item()`, the next
//      cell's kernels on that device) hangs, where with a blocking receive only the core's
//      own stream stuck. Until the benefit is measured on a GPU and such a wait can be
//      released, it is asked for. A message by NCCL is ordered so too, once its ncclRecv is
//      queued (Note [NCCL point-to-point] D; not while the pair's set-up runs, nor where the
//      receive names another device than the pair's): the consumer's stream waits for that
//      transfer's event and the receive gets its memory at once. When that rank fails, its
//      communicators are aborted: a transfer that ends so fires its event, and the consumer's
//      stream goes on with bytes NCCL never wrote (the rank's next core op raises); one that
//      does not leaves it waiting, as above. One through host memory (staged, G's resend) or
//      read into host memory completes once its bytes are there, as before.
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

std::string seconds(double s) {
  common::Text os;
  os << s;
  return os.str();
}

}  // namespace

DevicePeerOps::DevicePeerOps(int wake_fd, double timeout_seconds,
                             HostCopyStreams& host_copies)
    : wake_(wake_fd), timeout_(timeout_seconds), host_copies_(host_copies) {}

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
  // H: a gated host read's second phase is the loop's (copyOut), so it keeps its wake.
  copy.caller_polls = !copy.gated && awaited_ >= 0 && copy.id == static_cast<uint64_t>(awaited_);
  const Status woken = copy.caller_polls ? Status::ok() : wake_.notifyAfter(*copy.stream);
  if (!woken.isOk()) {
    copy.stream->release(copy.done);  // it will fire; nobody polls it
    return woken;
  }
  copy.since = std::chrono::steady_clock::now();
  if (copy.caller_polls) caller_polled_.fetch_add(1, std::memory_order_release);
  copies_.push_back(std::move(copy));
  return Status::ok();
}

void DevicePeerOps::forget(Copy& copy) {
  if (copy.caller_polls) caller_polled_.fetch_sub(1, std::memory_order_release);
  copy.caller_polls = false;
}

bool DevicePeerOps::callerPolls(int64_t handle) const {
  if (handle < 0 || !callerPollsAny()) return false;
  return std::any_of(copies_.begin(), copies_.end(), [handle](const Copy& copy) {
    return copy.caller_polls && copy.id == static_cast<uint64_t>(handle);
  });
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
  Copy copy;
  copy.id = id;
  copy.what = what;
  copy.stream = d->stream.get();
  // The room's event may be recorded again once the receiver released it, even before this
  // copy ran (a receive that failed): the send's completion has its own event.
  if (status.isOk()) status = queueDone(std::move(copy));
  if (!status.isOk()) {
    ring->release(message->sequence);  // no frame goes: nobody reads it
    return status;
  }
  return Status::ok();
}

void DevicePeerOps::released(int peer, uint64_t sequence) {
  for (auto& [ordinal, d] : devices_) {
    auto ring = d.rings.find(peer);
    if (ring != d.rings.end()) ring->second->release(sequence);
  }
}

Status DevicePeerOps::read(int peer, const transport::DeviceMessage& message, uint64_t bytes,
                           int device_ordinal, bool on_device, uint64_t id,
                           const std::string& what, int64_t consumer,
                           std::shared_ptr<OutputBuffer>* handed_over, Status* handover) {
  nccl::DeviceRestorer restore;
  PerDevice* d = nullptr;
  HVD_RETURN_IF_ERROR(device(device_ordinal, &d));
  auto& imports = d->imports[peer];
  if (!imports) imports = std::make_unique<transport::cuda::IpcImports>(*d->stream);
  const uint8_t* source = nullptr;
  nccl::CudaEvent written = nullptr;
  const Status opened = imports->open(message, bytes, &source, &written);
  if (!opened.isOk()) {
    return common::internalError("cannot read its CUDA memory by IPC (" + opened.message() +
                                 ")");
  }
  HVD_RETURN_IF_ERROR(d->stream->waitFor(written));
  if (!on_device) return startHostCopy(*d, device_ordinal, source, bytes, id, what);
  Copy copy;
  copy.id = id;
  copy.what = what;
  copy.stream = d->stream.get();
  void* block = nullptr;
  size_t capacity = 0;
  HVD_RETURN_IF_ERROR(DeviceOutputPool::instance().take(bytes, *d->stream, &block, &capacity));
  copy.output = pooledDeviceOutput(block, bytes, device_ordinal, capacity);
  HVD_RETURN_IF_ERROR(d->stream->copy(block, source, bytes));
  if (consumer < 0) return queueDone(std::move(copy));
  // I: the copy's entry keeps the block until it ran (a caller may drop the tensor sooner);
  // never the awaited handle, so its completion wakes the loop, which sends the receipt.
  copy.id = kHandedOver;
  copy.output->release_stream = static_cast<uintptr_t>(consumer);  // its users run there
  copy.receipt_peer = peer;
  copy.receipt_sequence = message.sequence;
  std::shared_ptr<OutputBuffer> output = copy.output;
  HVD_RETURN_IF_ERROR(queueDone(std::move(copy)));
  *handover = d->stream->check(
      nccl::cudaApi()->streamWaitEvent(reinterpret_cast<nccl::CudaStream>(consumer),
                                       copies_.back().done, 0),
      "cudaStreamWaitEvent (the receiving stream on the received tensor's copy)");
  if (handover->isOk()) *handed_over = std::move(output);
  return Status::ok();
}

// D: phase 1 only marks the point of `d`'s stream after which the bytes are final.
Status DevicePeerOps::startHostCopy(PerDevice& d, int device_ordinal, const uint8_t* source,
                                    uint64_t bytes, uint64_t id, const std::string& what) {
  Copy copy;
  copy.id = id;
  copy.what = what;
  copy.stream = d.stream.get();
  copy.output = hostOutput(static_cast<size_t>(bytes));
  if (!copy.output || copy.output->data == nullptr) {
    return common::internalError(what + ": no host memory for " + std::to_string(bytes) +
                                 " bytes");
  }
  HVD_RETURN_IF_ERROR(host_copies_.get(device_ordinal, &copy.copy_out));
  HVD_RETURN_IF_ERROR(d.stream->select());
  copy.gated = true;
  copy.source = source;
  return queueDone(std::move(copy));
}

Status DevicePeerOps::restage(int peer, uint64_t sequence, uint64_t id) {
  nccl::DeviceRestorer restore;
  for (auto& [ordinal, d] : devices_) {
    auto ring = d.rings.find(peer);
    const uint8_t* source = nullptr;
    uint64_t bytes = 0;
    if (ring == d.rings.end() || !ring->second->find(sequence, &source, &bytes)) continue;
    HVD_RETURN_IF_ERROR(d.stream->select());
    return startHostCopy(d, ordinal, source, bytes, id,
                         "the resend of a CUDA tensor to rank " + std::to_string(peer));
  }
  return common::internalError("rank " + std::to_string(peer) + " refused device message " +
                               std::to_string(sequence) + ", which this rank never sent");
}

// D, phase 2: the sender's bytes are final; the copy runs alone on the copy-out stream.
Status DevicePeerOps::copyOut(Copy& copy) {
  copy.stream->release(copy.done);
  copy.done = nullptr;
  copy.gated = false;
  copy.stream = copy.copy_out;
  HVD_RETURN_IF_ERROR(copy.stream->select());
  HVD_RETURN_IF_ERROR(copy.stream->copy(copy.output->data, copy.source, copy.output->bytes));
  HVD_RETURN_IF_ERROR(copy.stream->record(&copy.done));
  copy.since = std::chrono::steady_clock::now();
  return wake_.notifyAfter(*copy.stream);
}

Status DevicePeerOps::poll(std::vector<Done>* done) {
  if (copies_.empty()) return Status::ok();
  nccl::DeviceRestorer restore;
  const auto now = std::chrono::steady_clock::now();
  moved_.clear();  // F: streams on which a copy finished in this poll
  for (auto it = copies_.begin(); it != copies_.end();) {
    Copy& copy = *it;
    bool finished = false;
    HVD_RETURN_IF_ERROR(copy.stream->select());
    HVD_RETURN_IF_ERROR(copy.stream->query(copy.done, &finished));
    if (finished && copy.gated) {
      moved_.push_back(copy.stream);  // (copyOut moves it to another stream)
      HVD_RETURN_IF_ERROR(copyOut(copy));
      HVD_RETURN_IF_ERROR(copy.stream->query(copy.done, &finished));  // pageable: often done
    }
    if (!finished) {
      if (std::find(moved_.begin(), moved_.end(), copy.stream) != moved_.end()) {
        copy.since = now;  // its stream moves: it waits its turn, not a peer that stopped
      }
      if (now - copy.since > timeout_) {
        return common::timedOut(copy.what + ": its CUDA copy did not finish in " +
                                seconds(timeout_.count()) + " s (HVD_TIMEOUT): the kernel that "
                                "produces the tensor still runs, or its sender stopped");
      }
      ++it;
      continue;
    }
    copy.stream->release(copy.done);
    forget(copy);
    moved_.push_back(copy.stream);
    if (copy.receipt_peer >= 0) {
      done->push_back(Done{copy.id, nullptr, copy.receipt_peer, copy.receipt_sequence});
    } else {
      done->push_back(Done{copy.id, std::move(copy.output)});
    }
    it = copies_.erase(it);
  }
  return Status::ok();
}

bool DevicePeerOps::drain() {
  nccl::DeviceRestorer restore;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  bool drained = true;
  host_copies_.drain(deadline);  // holds no wait on a peer: it drains
  for (auto& [ordinal, d] : devices_) {
    if (!d.stream || !d.stream->select().isOk()) continue;
    if (!d.stream->drain(deadline)) {
      drained = false;
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
  return drained;
}

void DevicePeerOps::abandon() {
  if (!drain()) {  // F: a stuck copy may still write its output: never reuse it
    for (Copy& copy : copies_) keepUntilExit(std::move(copy.output));
  }
  for (Copy& copy : copies_) forget(copy);
  copies_.clear();
}

}  // namespace hvd::runtime
