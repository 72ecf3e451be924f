// Where PeerOps's received payloads go (runtime/peer_ops.h): an output the core reuses, or the
// memory a posted receive brought (out=).
//
// Note [Received payloads]
// A message lands in an output the core reuses (hostOutput, Note [Host output reuse]) up to
// kPooledPayloadBytes, so a pipeline's same-shaped activations find pages already faulted in
// rather than fresh ones every message; a larger one in a mapping reserved with MAP_NORESERVE
// (transport/peer_channel.h: what a header claims is committed only as bytes arrive). Either
// is an OutputBuffer, the receive's result.
//
// Note [Receive into out]
// A receive given out= (an array of the message's dtype and shape) had its message land in an
// output, then copied into out by the binding: a third pass over the bytes (the ring's two
// are the transport's). Now, as MPI's posted receive buffers:
//   A. When a frame's header is read, the receive that will take it is known: with k messages
//      of its tag from that peer already complete and unmatched (Arrived, or completed in this
//      same read), it is the (k+1)-th posted receive of that tag (Note [Point-to-point] B),
//      taken by a pass or still submitted (a caller submits while the loop thread reads). If
//      that receive brought `into` and the frame is a host message of exactly its dtype and
//      shape, the payload is written there (the receive is `bound`); else it goes to an
//      output (a message that arrives before its receive is posted, or whose type differs:
//      the binding then copies or raises, as before).
//   B. match() pairs the bound receive with that message (checked), and the result is an
//      OutputBuffer over `into` that frees nothing; the binding sees its own array and skips
//      the copy.
//   C. A bound receive that ends before its message (timed out, the rank shutting down or
//      failing) unbinds first: the channel moves the message so far into an output (or the
//      next posted receive of the tag, by A) and never writes `into` again, whose owner may
//      reuse it at once. What was written there stays: a failed receive leaves out partly
//      written, as MPI leaves a failed receive's buffer undefined.
#include <deque>
#include <memory>
#include <utility>

#include "runtime/host_output_pool.h"
#include "runtime/peer_ops.h"

namespace hvd::runtime {

namespace {

constexpr uint64_t kPooledPayloadBytes = 1ull << 30;

transport::PeerPayload outputPayload(uint64_t bytes) {
  std::shared_ptr<OutputBuffer> out;
  if (bytes <= kPooledPayloadBytes) {
    out = hostOutput(static_cast<size_t>(bytes));
  } else if (uint8_t* mapped = transport::reservePayloadMapping(bytes)) {
    const auto size = static_cast<size_t>(bytes);
    out = std::make_shared<OutputBuffer>(mapped, size, -1, size, [](OutputBuffer& b) {
      transport::releasePayloadMapping(b.data, b.capacity);
    });
  }
  if (!out || out->data == nullptr) return {};
  uint8_t* data = out->data;
  return {std::move(out), data};
}

// A message that takes a part in matching (the protocol frames never reach Arrived).
bool matchable(transport::PeerFrameKind kind) {
  return kind == transport::PeerFrameKind::kHost || kind == transport::PeerFrameKind::kDevice ||
         kind == transport::PeerFrameKind::kDeviceNccl;
}

}  // namespace

transport::PeerPayload PeerOps::payloadFor(void* self, int peer,
                                           const transport::PeerFrame& frame) {
  return static_cast<PeerOps*>(self)->bindOrAllocate(peer, frame);
}

transport::PeerPayload PeerOps::bindOrAllocate(int peer, const transport::PeerFrame& frame) {
  PerPeer& p = peers_[peer];
  if (frame.kind != transport::PeerFrameKind::kHost || frame.bytes == 0) {
    return outputPayload(frame.bytes);
  }
  size_t ahead = 0;  // A: complete, unmatched messages of this tag
  for (const Arrived& a : p.arrived) ahead += a.tag == frame.tag ? 1 : 0;
  for (const transport::PeerMessage& m : received_) {
    ahead += matchable(m.frame.kind) && m.frame.tag == frame.tag ? 1 : 0;
  }
  // The posted receives in order: those a pass took, then those submitted since (a caller may
  // submit while the loop thread's pass reads: A's receive is then still in submitted_).
  Op* taker = nullptr;
  for (Op& r : p.receiving) {
    if (r.tag == frame.tag && ahead-- == 0) {
      taker = &r;
      break;
    }
  }
  std::unique_lock<std::mutex> lock(mutex_, std::defer_lock);
  if (taker == nullptr) {
    lock.lock();
    for (Op& r : submitted_) {
      if (!r.is_send && r.peer == peer && r.tag == frame.tag && ahead-- == 0) {
        taker = &r;
        break;
      }
    }
  }
  if (taker == nullptr || taker->into == nullptr || taker->bound ||
      taker->dtype != frame.dtype || taker->shape != frame.shape) {
    return outputPayload(frame.bytes);
  }
  taker->bound = true;
  return {nullptr, taker->into};
}

void PeerOps::unbind(const Op& op) {  // C
  if (!op.bound) return;
  if (transport::PeerChannel* channel = mesh_.peerChannel(op.peer)) {
    channel->rehomeIncoming(op.into);
  }
}

common::Status PeerOps::failureOf(const Op& op, const common::Status& status) {
  const std::string mine = what(op.is_send ? "send" : "recv", op.peer, op.tag);
  if (status.message().rfind(mine, 0) == 0) return status;
  return common::Status(status.code(), mine + ": " + status.message());
}

void PeerOps::failTaken(const common::Status& status) {
  for (Op& op : taking_) {
    unbind(op);  // a receive bound while still submitted
    handles_.complete(op.handle, failureOf(op, status));
  }
  taking_.clear();
}

std::deque<PeerOps::Op> PeerOps::takeReceives(PerPeer& p) {
  std::deque<Op> receiving;
  receiving.swap(p.receiving);
  for (const Op& op : receiving) unbind(op);
  return receiving;
}

}  // namespace hvd::runtime
