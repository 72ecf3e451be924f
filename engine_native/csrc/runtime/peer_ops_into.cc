// Where PeerOps's received payloads go (runtime/peer_ops.h): an output the core reuses, or the
// memory a posted receive brought (out=); the refusal of a message that does not fit out=; and
// the end of a receive, whatever its route: completed, or failed where its route could not.
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
//
// Note [Refused messages]
// A receive given out= whose message had another dtype or shape raised on the receiving rank
// alone: the send had completed, and its rank went on — a pipeline stage then waited for an
// answer that never came, until HVD_TIMEOUT, with no word of why. Now the refusal goes back,
// at no cost while types fit (no frame, no round trip):
//   A. The receiver. A receive that carries its out='s dtype and shape (`expects`: the binding
//      passes them for every out=, with `into` where the core can write it, alone for one it
//      cannot: strided, on a CUDA device, empty) takes its message and completes exactly as
//      before: the binding raises ValueError naming both types, the message is consumed, the
//      next op is unaffected. When the types differ, match() also queues a kRefused frame on
//      the same channel as the message (the pair's authenticated connection or ring; written
//      in that pass): the message's tag, its ordinal (how many kHost, kDevice and kDeviceNccl
//      messages of that sender came before it: both ranks count them in the one stream's
//      order) and the reason, "it is float32 (4,), the tensor to fill is float64 (4,)". A CUDA
//      message is still read as before (its receipt, its ncclRecv): no device protocol changes.
//   B. The sender reads it (bounded, printable: checked, else the frame is malformed) as a
//      ValueError "send to rank R (tag T): rank R refused the message: <reason>". The send of
//      that ordinal, if still in flight (frame partly written, split copy unanswered, CUDA copy
//      running), fails with it when it would have completed: only then is its tensor the
//      caller's again. And every receive from R already posted and still without its message
//      after that read fails with it at once, unbound first (Receive into out C): a "send, then
//      receive the answer" raises within HVD_TIMEOUT, not later; a message of theirs that
//      comes later waits for the next receive of its tag, as after a timeout.
//   C. When neither took it (the send had completed, no receive waited), it waits on R and
//      fails the next send to R, or the next receives from R that do not get their message as
//      they are posted (one whose message is here takes it and leaves the refusal waiting);
//      then it is spent and later ops go on. More refusals of completed sends meanwhile add a
//      count to its text; one of a send in flight is that send's (B), so in a read that brings
//      both, the one that waits is kept: each is raised once. A refusal in R's ring is read
//      before new ops to R are taken (takeSubmitted); one in its socket only once the loop's
//      poll saw it readable, so over TCP "next" is the next op taken after this rank read it (a
//      blocking op its caller drives may come first). A message R sent after refusing comes
//      after the refusal (one stream): once it is received here, the refusal has been read.
//   D. Shutdown (Point-to-point F): a refusal that arrives meanwhile still fails the refused
//      send if in flight, and is dropped otherwise (posted receives failed already, no new op
//      starts); failAll forgets one that waits, with the rest of PerPeer. A receiver writes
//      its refusals until its loop ends, as its receipts.
#include <algorithm>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include "common/dtype.h"
#include "common/text.h"
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

std::string typeText(common::DataType dtype, const std::vector<int64_t>& shape) {
  return std::string(common::dataTypeName(dtype)) + " " +  // "float32 (4,)"
         common::tupleText(shape.data(), shape.size());
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
  // The posted receives in order: those a pass took, those being taken (takeSubmitted reads
  // first: Note [Refused messages] C), then those submitted since (a caller may submit while
  // the loop thread's pass reads: A's receive is then still in submitted_).
  Op* taker = nullptr;
  for (Op& r : p.receiving) {
    if (r.tag == frame.tag && ahead-- == 0) {
      taker = &r;
      break;
    }
  }
  for (size_t k = 0; taker == nullptr && k < taking_.size(); ++k) {
    Op& r = taking_[k];
    if (!r.is_send && r.peer == peer && r.tag == frame.tag && ahead-- == 0) taker = &r;
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

// Note [Refused messages] A.
void PeerOps::refuseIfUnfit(const Op& receive, const Arrived& message) {
  const transport::PeerFrame& frame = message.message.frame;
  if (frame.dtype == receive.dtype && frame.shape == receive.shape) return;
  if (!open(receive.peer)) return;
  PerPeer& p = peers_[receive.peer];
  p.refusals.push_back(transport::encodeRefusal(
      message.ordinal, "it is " + typeText(frame.dtype, frame.shape) +
                           ", the tensor to fill is " + typeText(receive.dtype, receive.shape)));
  transport::PeerFrame refusal;
  refusal.kind = transport::PeerFrameKind::kRefused;
  refusal.tag = frame.tag;
  refusal.bytes = p.refusals.back().size();
  mesh_.peerChannel(receive.peer)->send(refusal, p.refusals.back().data(), kRefusalId);
}

// B: the refused send, if in flight, is marked; settleRefusal, after the read's matches, fails
// the receives still posted (not here: a later message of this read may be bound to one).
common::Status PeerOps::refusedBy(int peer, PerPeer& p, const transport::PeerMessage& message) {
  uint64_t ordinal = 0;
  std::string reason;
  HVD_RETURN_IF_ERROR(transport::decodeRefusal(message.payload.data, message.frame.bytes,
                                               &ordinal, &reason));
  const int64_t tag = message.frame.tag;
  const common::Status refusal = common::invalidArgument(
      what("send", peer, tag) + ": rank " + std::to_string(peer) + " refused the message: " +
      reason);
  auto refused = [ordinal, tag](const Op& op) {
    return op.ordinal == ordinal && op.tag == tag && op.refusal.isOk();
  };
  bool in_flight = false;
  for (std::deque<Op>* sends : {&p.sending, &p.staged}) {
    auto s = std::find_if(sends->begin(), sends->end(), refused);
    if (s == sends->end()) continue;
    s->refusal = refusal;
    in_flight = true;
    break;
  }
  if (shutting_down_) return common::Status::ok();  // D
  // C: one its own send raises (in flight) gives way to one that waits, which alone is
  // counted into a waiting one (else the first were raised twice, and this one's text lost)
  if (p.refused.isOk() || (p.refused_in_flight && !in_flight)) {
    p.refused = refusal;
    p.refused_more = 0;
    p.refused_in_flight = in_flight;
  } else if (!in_flight) {
    ++p.refused_more;
  }
  return common::Status::ok();
}

// B, C: every receive still posted (none has a whole message bound to it: match() took those)
// fails with the refusal; with none, it waits for the next op unless its send raises it.
void PeerOps::settleRefusal(PerPeer& p) {
  if (p.receiving.empty()) {
    if (p.refused_in_flight) {
      p.refused = common::Status::ok();
      p.refused_more = 0;
    }
    return;
  }
  const common::Status refusal = takeRefusal(p);
  for (const Op& op : takeReceives(p)) {  // unbound before their completion (Receive into C)
    listen(-1);
    fail(op, failureOf(op, refusal));
  }
}

common::Status PeerOps::takeRefusal(PerPeer& p) {
  std::string text = p.refused.message();
  if (p.refused_more > 0) {
    text += " (and " + std::to_string(p.refused_more) + " later message" +
            (p.refused_more > 1 ? "s were" : " was") + " refused too)";
  }
  p.refused = common::Status::ok();
  p.refused_more = 0;
  p.refused_in_flight = false;
  return common::Status(common::Code::kInvalidArgument, text);
}

void PeerOps::completeReceive(const Op& op, std::shared_ptr<OutputBuffer> buffer,
                              std::vector<int64_t> shape, common::DataType dtype) {
  uint64_t bytes = 0;
  transport::peerPayloadBytes(dtype, shape, &bytes);  // (checked when the message arrived)
  listen(-1);
  metrics_.countP2p(/*sent=*/false, bytes);
  endSpan(op);
  OpResult result;
  result.buffer = std::move(buffer);
  result.shape = std::move(shape);
  result.dtype = static_cast<int32_t>(dtype);
  handles_.complete(op.handle, common::Status::ok(), std::move(result));
}

void PeerOps::failReceive(const Op& op, const common::Status& status) {
  listen(-1);
  fail(op, common::Status(status.code(), what("recv", op.peer, op.tag) + ": " +
                                             status.message()));
}

}  // namespace hvd::runtime
