// PeerOps' CUDA messages between ranks of one host (runtime/peer_ops.h): staging a send,
// reading a message, receipts, and a refused message's resend through host memory. The
// rules: Note [Device point-to-point] in runtime/device_peer_ops.cc; the copies themselves
// are DevicePeerOps'.
#include "runtime/peer_ops.h"

#include <algorithm>
#include <atomic>
#include <memory>
#include <string>
#include <utility>

#include "common/logging.h"

namespace hvd::runtime {

using common::Status;

namespace {
constexpr int64_t kCudaStreamPerThread = 2;  // cudaStreamPerThread's handle
}  // namespace

// Note [Device point-to-point] B: the copy is queued and the frame sent in the same pass.
void PeerOps::stageDeviceSend(Op& op) {
  if (op.by_nccl) {
    stageNcclSend(op);  // Note [NCCL point-to-point] B
    return;
  }
  uint64_t bytes = 0;
  transport::peerPayloadBytes(op.dtype, op.shape, &bytes);
  transport::DeviceMessage message;
  const Status staged = device_.stage(op.peer, op.device, op.ready.get(), op.data, bytes,
                                      static_cast<uint64_t>(op.handle),
                                      what("send", op.peer, op.tag), &message);
  op.ready.reset();  // the stream's wait on it is queued (or nothing was)
  if (!staged.isOk()) {
    fail(op, staged);
    return;
  }
  transport::PeerFrame frame;
  frame.kind = transport::PeerFrameKind::kDevice;
  frame.tag = op.tag;
  frame.dtype = op.dtype;
  frame.shape = op.shape;
  frame.bytes = transport::kDeviceMessageBytes;
  op.payload = std::make_shared<const std::string>(transport::encodeDeviceMessage(message));
  noteSent(op);  // Note [Refused messages]
  mesh_.peerChannel(op.peer)->send(frame, op.payload->data(), static_cast<uint64_t>(op.handle));
  peers_[op.peer].sending.push_back(std::move(op));
}


// Note [Device point-to-point] D. The receipt goes back whatever happens to the read: the
// sender's memory is free either way.
void PeerOps::startDeviceRead(PerPeer& p, Op op, Arrived arrived) {
  const transport::PeerFrame& frame = arrived.message.frame;
  uint64_t bytes = 0;
  transport::peerPayloadBytes(frame.dtype, frame.shape, &bytes);
  Status status = Status::ok();
  if (op.device < 0) {
    status = common::invalidArgument(
        what("recv", op.peer, op.tag) + ": the message is a CUDA tensor and this receive names "
        "no CUDA device to read it with (engine_native.torch's recv(device=...) does, or "
        "HVD_GPU_PATH=staged on the sender sends it through host memory)");
  }
  std::shared_ptr<OutputBuffer> handed_over;  // I
  Status handover = Status::ok();
  if (status.isOk()) {
    status = device_.read(op.peer, arrived.device, bytes, op.device, op.on_device,
                          static_cast<uint64_t>(op.handle), what("recv", op.peer, op.tag),
                          op.consumer, &handed_over, &handover);
  }
  op.dtype = frame.dtype;
  op.shape = frame.shape;
  op.sequence = arrived.device.sequence;
  if (status.isOk() && op.consumer >= 0) {  // I: the copy is queued (on_device: submitRecv)
    if (!handover.isOk()) {  // (its receipt still goes back once the copy ran)
      failReceive(op, handover);
      return;
    }
    completeReceive(op, std::move(handed_over), op.shape, op.dtype);
    return;
  }
  if (!status.isOk()) {  // G: the bytes come again, through host memory
    static std::atomic<bool> warned{false};
    if (!warned.exchange(true)) {
      HVD_LOG(kWarning, "transport") << what("recv", op.peer, op.tag) << ": a CUDA tensor that "
                                     << "this rank cannot read: " << status.message()
                                     << "; rank " << op.peer << " resends it, and sends the "
                                     << "next ones, through host memory";
    }
    sendReceipt(op.peer, op.sequence, transport::PeerFrameKind::kDeviceRefused);
    op.awaiting_resend = true;
    op.since = Clock::now();  // timeOut() bounds the wait for the resend
  }
  p.reading.push_back(std::move(op));
}

void PeerOps::sendReceipt(int peer, uint64_t sequence, transport::PeerFrameKind kind) {
  PerPeer& p = peers_[peer];
  p.receipts.push_back(transport::encodeDeviceRead(sequence));
  transport::PeerFrame frame;
  frame.kind = kind;
  frame.bytes = transport::kDeviceReadBytes;
  mesh_.peerChannel(peer)->send(frame, p.receipts.back().data(), kReceiptId);
}

// Note [Device point-to-point] G, the sender: CUDA tensors to `peer` are staged from now on;
// this message's bytes, still in its room, go again through host memory.
Status PeerOps::refused(int peer, uint64_t sequence) {
  if (!ipc_refused_[peer].exchange(true)) {
    HVD_LOG(kWarning, "transport") << "rank " << peer << " cannot read this rank's CUDA memory "
                                   << "by IPC: CUDA tensors to it go through host memory";
  }
  const uint64_t id = kRestageBit | next_restage_++;
  restaging_[id] = {peer, sequence};
  const Status status = device_.restage(peer, sequence, id);
  if (!status.isOk()) restaging_.erase(id);
  return status;  // not OK: the receiver would wait for nothing; the rank fails
}

void PeerOps::completeResend(uint64_t id, std::shared_ptr<OutputBuffer> bytes) {
  const auto [peer, sequence] = restaging_.at(id);
  restaging_.erase(id);
  device_.released(peer, sequence);  // the bytes are in host memory now
  if (!open(peer)) return;           // Note [Point-to-point] F: nobody waits for them
  PerPeer& p = peers_[peer];
  transport::PeerFrame frame;
  frame.kind = transport::PeerFrameKind::kDeviceResend;
  frame.tag = static_cast<int64_t>(sequence);
  frame.shape = {static_cast<int64_t>(bytes->bytes)};
  frame.bytes = bytes->bytes;
  p.resends.push_back(std::move(bytes));
  mesh_.peerChannel(peer)->send(frame, p.resends.back()->data, kResendId);
}

// G, the receiver: the refused message's bytes, for the receive that waits for them.
Status PeerOps::resent(PerPeer& p, transport::PeerMessage message) {
  const auto sequence = static_cast<uint64_t>(message.frame.tag);
  auto r = std::find_if(p.reading.begin(), p.reading.end(), [sequence](const Op& op) {
    return op.awaiting_resend && op.sequence == sequence;
  });
  uint64_t bytes = 0;
  if (r != p.reading.end()) transport::peerPayloadBytes(r->dtype, r->shape, &bytes);
  if (r == p.reading.end() || bytes != message.frame.bytes) {
    return common::internalError("malformed point-to-point frame: a resent device message (" +
                                 std::to_string(message.frame.bytes) + " bytes) that no "
                                 "refused receive waits for");
  }
  completeReceive(*r, std::static_pointer_cast<OutputBuffer>(std::move(message.payload.owner)),
                  r->shape, r->dtype);
  p.reading.erase(r);
  return Status::ok();
}

// Note [Device point-to-point] H: a caller that polls its copy outside a pass also writes
// what the copies' completions queued (a read's receipt, which frees the sender's room), as
// the pass it replaces would have.
Status PeerOps::pollDevice() {
  HVD_RETURN_IF_ERROR(progressDevice());
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
    if (!open(peer) || !mesh_.peerChannel(peer)->hasBacklog()) continue;
    bool wrote = false;
    const Status status = flushPeer(peer, Clock::now(), &wrote);
    if (status.isOk()) continue;
    if (!shutting_down_) return status;
    closePeer(peer, status);  // as progress() does (F)
  }
  return Status::ok();
}

Status PeerOps::progressDevice() {
  if (!device_.busy()) return Status::ok();
  device_done_.clear();
  HVD_RETURN_IF_ERROR(device_.poll(&device_done_));
  for (DevicePeerOps::Done& done : device_done_) {
    if (done.receipt_peer >= 0) {  // I: a read whose receive completed when it was queued
      if (open(done.receipt_peer)) sendReceipt(done.receipt_peer, done.receipt_sequence);
      continue;
    }
    if (done.id & kRestageBit) {
      completeResend(done.id, std::move(done.output));
      continue;
    }
    const auto handle = static_cast<int64_t>(done.id);
    if (!done.output) {  // a send's staging copy (a read always has an output)
      deviceSendDone(handle);
      continue;
    }
    auto has = [handle](const Op& op) { return op.handle == handle; };
    for (PerPeer& p : peers_) {
      if (auto r = std::find_if(p.reading.begin(), p.reading.end(), has);
          r != p.reading.end()) {
        sendReceipt(r->peer, r->sequence);
        completeReceive(*r, std::move(done.output), r->shape, r->dtype);
        p.reading.erase(r);
        break;
      }
    }
  }
  return Status::ok();
}

// I, at submission: a stream the loop may queue a wait on (its caller waits at once, so its
// thread queues nothing there meanwhile: PeerRecv), named by its handle, outside a capture.
Status PeerOps::orderOnConsumer(const PeerRecv& recv, Op* op) {
  if (recv.consumer < 0 || !op->on_device) return Status::ok();
  if (recv.consumer == kCudaStreamPerThread) {
    return common::invalidArgument(
        what("recv", op->peer, op->tag) + ": a receive ordered on its consumer's stream needs "
        "the stream's own handle, not cudaStreamPerThread (that would name the core's "
        "thread's stream)");
  }
  HVD_RETURN_IF_ERROR(refuseGraphCapture(static_cast<uintptr_t>(recv.consumer),
                                         what("recv", op->peer, op->tag)));
  op->consumer = recv.consumer;
  return Status::ok();
}

}  // namespace hvd::runtime
