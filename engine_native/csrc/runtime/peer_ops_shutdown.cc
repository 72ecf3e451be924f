// PeerOps while its rank shuts down (runtime/peer_ops.h): Note [Point-to-point] F.
#include "runtime/peer_ops.h"

#include <utility>

#include "runtime/submission_queue.h"
#include "transport/shm/segment.h"

namespace hvd::runtime {

using common::Status;

// F: nothing new starts, nothing already started is cut off. A posted receive has no message
// yet and fails; a send (its frame partly written, or its CUDA copy running) goes on and
// completes as sent, since its tensor is the caller's until then; a CUDA receive whose copy
// runs, or that waits for its resend, completes when its bytes are here.
void PeerOps::beginShutdown(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_.isOk()) failure_ = status;  // later submissions fail with it
    taking_.swap(submitted_);
  }
  failTaken(status);
  shutting_down_ = true;
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
    PerPeer& p = peers_[peer];
    for (const Op& op : takeReceives(p)) {
      listen(-1);
      endSpan(op, status);
      handles_.complete(op.handle, failureOf(op, status));
    }
    for (const Arrived& arrived : p.arrived) dropArrival(peer, arrived);
    p.arrived.clear();
  }
  // A peer's frame wakes this rank's sleeping loop only while a receive is open (Note
  // [Point-to-point over shm] B); a refusal this rank must answer is such a frame, so the
  // shutting-down rank listens until failAll ends it.
  listen(+1);
}

// A CUDA message no receive will take: its room is released at once (the sender's memory is
// free either way, Note [Device point-to-point] D), so a sender that goes on running does not
// keep it staged.
void PeerOps::dropArrival(int peer, const Arrived& arrived) {
  if (arrived.message.frame.kind == transport::PeerFrameKind::kDevice) {
    sendReceipt(peer, arrived.device.sequence);
  }
}

void PeerOps::closePeer(int peer, const Status& status) {
  closed_[peer] = 1;
  PerPeer& p = peers_[peer];
  mesh_.peerChannel(peer)->dropOutbox();  // never written again: a partial frame is harmless
  for (const auto* ops : {&p.sending, &p.staged, &p.reading}) {
    for (const Op& op : *ops) {
      if (!op.is_send) listen(-1);
      endSpan(op, status);
      handles_.complete(op.handle, status);
    }
  }
  // Copies still running for this peer (a staged send's, a restaged message's) finish into
  // nothing: progressDevice finds no op for them, and completeResend drops a closed peer's.
  p = PerPeer();
}

}  // namespace hvd::runtime
