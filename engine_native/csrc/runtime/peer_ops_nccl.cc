// PeerOps' CUDA messages through NCCL (runtime/peer_ops.h): the frames around the transfers
// DeviceNcclPeers queues. The rules: Note [NCCL point-to-point] in device_nccl_peers.cc.
#include "runtime/peer_ops.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>

namespace hvd::runtime {

using common::Status;

// B: the pair's unique id (its first message only), then the message's frame, in one pass.
void PeerOps::stageNcclSend(Op& op) {
  uint64_t bytes = 0;
  transport::peerPayloadBytes(op.dtype, op.shape, &bytes);
  std::string id_payload;
  const Status queued = nccl_.send(op.peer, op.device, std::move(op.ready), op.data, bytes,
                                   static_cast<uint64_t>(op.handle),
                                   what("send", op.peer, op.tag), &id_payload);
  if (!queued.isOk()) {
    fail(op, queued);
    return;
  }
  transport::PeerChannel* channel = mesh_.peerChannel(op.peer);
  PerPeer& p = peers_[op.peer];
  if (!id_payload.empty()) {
    p.receipts.push_back(std::move(id_payload));  // written in order, popped by kReceiptId
    transport::PeerFrame id_frame;
    id_frame.kind = transport::PeerFrameKind::kNcclId;
    id_frame.bytes = transport::kNcclIdBytes;
    channel->send(id_frame, p.receipts.back().data(), kReceiptId);
  }
  transport::PeerFrame frame;
  frame.kind = transport::PeerFrameKind::kDeviceNccl;
  frame.tag = op.tag;
  frame.dtype = op.dtype;
  frame.shape = op.shape;
  frame.bytes = 0;
  noteSent(op);  // Note [Refused messages]
  channel->send(frame, nullptr, static_cast<uint64_t>(op.handle));
  p.sending.push_back(std::move(op));  // completes once written and NCCL took its bytes
}

// C and D: a kDeviceNccl message's ncclRecv is queued as it arrives, whatever takes it.
Status PeerOps::arriveNccl(int peer, PerPeer& p, transport::PeerMessage message) {
  const transport::PeerFrame& frame = message.frame;
  if (frame.kind == transport::PeerFrameKind::kNcclId) {
    return nccl_.joined(peer, message.payload.data);
  }
  uint64_t bytes = 0;
  transport::peerPayloadBytes(frame.dtype, frame.shape, &bytes);
  if (bytes == 0) {
    return common::internalError("malformed point-to-point frame: an empty CUDA tensor by NCCL");
  }
  Arrived arrived{frame.tag, {}, {}, 0, nullptr, p.arrived_messages++};
  HVD_RETURN_IF_ERROR(nccl_.arrived(peer, bytes, what("recv", peer, frame.tag), &arrived.slot));
  if (shutting_down_) return Status::ok();  // Note [Point-to-point] F: its bytes are dropped
  arrived.message = std::move(message);
  p.arrived.push_back(std::move(arrived));
  return Status::ok();
}

// D: the receive takes the message's bytes now, or once its ncclRecv finished.
void PeerOps::startNcclRead(PerPeer& p, Op op, Arrived& arrived) {
  op.dtype = arrived.message.frame.dtype;
  op.shape = arrived.message.frame.shape;
  op.by_nccl = true;
  op.sequence = arrived.slot;
  if (op.device < 0 && nccl_.deviceOf(op.peer) < 0) {
    listen(-1);
    fail(op, common::invalidArgument(
                 what("recv", op.peer, op.tag) + ": the message is a CUDA tensor sent by NCCL "
                 "and no receive from that rank has named a CUDA device to receive it on yet "
                 "(engine_native.torch's recv(device=...) does); the sender's send fails after "
                 "HVD_TIMEOUT"));
    return;
  }
  if (arrived.nccl_bytes) {
    completeNcclRead(op, std::move(arrived.nccl_bytes));
    return;
  }
  // Note [Device point-to-point] I (on_device: submitRecv checks): only where the bytes land on
  // the consumer's device (E puts them on the pair's, whatever the receive named)
  if (op.consumer >= 0 && op.device == nccl_.deviceOf(op.peer)) {
    std::shared_ptr<OutputBuffer> handed_over;
    const Status handover = nccl_.handOver(arrived.slot, op.consumer, &handed_over);
    if (!handover.isOk()) {
      failReceive(op, handover);
      return;
    }
    if (handed_over) {
      completeReceive(op, std::move(handed_over), op.shape, op.dtype);
      return;
    }
  }
  p.reading.push_back(std::move(op));
}

// E: on the device as NCCL wrote it, or copied into host memory.
void PeerOps::completeNcclRead(const Op& op, std::shared_ptr<OutputBuffer> bytes) {
  std::shared_ptr<OutputBuffer> result = std::move(bytes);
  if (!op.on_device) {
    std::shared_ptr<OutputBuffer> host;
    const Status copied = nccl_.toHost(*result, &host);
    if (!copied.isOk()) {
      failReceive(op, copied);
      return;
    }
    result = std::move(host);
  }
  completeReceive(op, std::move(result), op.shape, op.dtype);
}

void PeerOps::deviceSendDone(int64_t handle) {
  auto has = [handle](const Op& op) { return op.handle == handle; };
  for (PerPeer& p : peers_) {
    if (auto s = std::find_if(p.sending.begin(), p.sending.end(), has); s != p.sending.end()) {
      s->copied = true;  // completes once its frame is written
      return;
    }
    if (auto s = std::find_if(p.staged.begin(), p.staged.end(), has); s != p.staged.end()) {
      completeSend(*s);
      p.staged.erase(s);
      return;
    }
  }
}

Status PeerOps::progressNccl() {
  if (!nccl_.busy()) return Status::ok();
  nccl_done_.clear();
  HVD_RETURN_IF_ERROR(nccl_.poll(&nccl_done_));
  for (DeviceNcclPeers::Done& done : nccl_done_) {
    if (!done.receive) {
      deviceSendDone(static_cast<int64_t>(done.id));
      continue;
    }
    PerPeer& p = peers_[done.peer];
    const uint64_t slot = done.id;
    auto r = std::find_if(p.reading.begin(), p.reading.end(),
                          [slot](const Op& op) { return op.by_nccl && op.sequence == slot; });
    if (r != p.reading.end()) {
      completeNcclRead(*r, std::move(done.output));
      p.reading.erase(r);
      continue;
    }
    auto m = std::find_if(p.arrived.begin(), p.arrived.end(),
                          [slot](const Arrived& a) { return a.slot == slot; });
    if (m != p.arrived.end()) {
      m->nccl_bytes = std::move(done.output);
    } else {
      done.output.reset();  // dropped (F), or handed over: its block back to the pool now
    }
  }
  return Status::ok();
}

}  // namespace hvd::runtime
