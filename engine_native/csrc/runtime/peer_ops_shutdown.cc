// How PeerOps's ops end other than by their message (runtime/peer_ops.h): the rank shutting
// down (Note [Point-to-point] F), HVD_TIMEOUT (D) and the loop's failure.
#include "runtime/peer_ops.h"

#include <poll.h>

#include <optional>
#include <string>
#include <utility>

#include "runtime/stopped_ranks.h"
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

void PeerOps::timeOut(PerPeer& p, Clock::time_point now) {
  // The ranks of this machine that are stopped: the peer, or one it waits for itself
  // (stopped_ranks.h); read once, when the first of its receives times out.
  std::optional<std::string> stopped;
  const auto stoppedNote = [&]() -> const std::string& {
    if (!stopped) stopped = stoppedRanksNote(mesh_, "");
    return *stopped;
  };
  for (auto r = p.reading.begin(); r != p.reading.end();) {  // G: a resend that never came
    if (!r->awaiting_resend || now - r->since <= timeout_) {
      ++r;
      continue;
    }
    const Status timed_out = common::timedOut(
        what("recv", r->peer, r->tag) + ": the CUDA tensor it refused was not resent through "
        "host memory within " + seconds(timeout_.count()) + " s (HVD_TIMEOUT)" + stoppedNote());
    listen(-1);
    fail(*r, timed_out);
    r = p.reading.erase(r);
  }
  for (auto r = p.receiving.begin(); r != p.receiving.end();) {
    if (now - r->since <= timeout_) {
      ++r;
      continue;
    }
    const Status timed_out = common::timedOut(
        what("recv", r->peer, r->tag) + ": no byte came from that rank for " +
        seconds(timeout_.count()) + " s (HVD_TIMEOUT): it is stopped, stuck, or never sends "
        "this tag" + stoppedNote());
    endSpan(*r, timed_out);
    listen(-1);
    const Op gone = std::move(*r);
    r = p.receiving.erase(r);
    // Note [Receive into out] C: after the erase, so it may bind the next; before the
    // completion, after which the caller may reuse or free its `out`
    unbind(gone);
    handles_.complete(gone.handle, timed_out);
  }
}

// Note [One round] K, I: what every connection holds is read before a failure judges the
// board's pending round, so a post that arrived before the failure was seen counts.
void PeerOps::readArrived(const std::vector<int>& peers, int wait_ms, std::vector<int>* lost) {
  std::vector<pollfd> fds;
  for (int peer : peers) {
    if (open(peer)) fds.push_back({mesh_.peerChannel(peer)->fd(), POLLIN, 0});
  }
  if (!fds.empty() && wait_ms > 0) ::poll(fds.data(), fds.size(), wait_ms);
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
    if (!open(peer)) continue;
    readable_[peer] = 1;  // the socket too, whatever the last poll said
    bool read = false;
    if (!readPeer(peer, Clock::now(), &read).isOk()) lost->push_back(peer);  // failAll follows
  }
}

void PeerOps::failAll(const Status& status) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (failure_.isOk()) failure_ = status;
    taking_.swap(submitted_);
    if (transport::shm::Doorbell* bell = mesh_.peerDoorbell()) {
      bell->listening.store(0, std::memory_order_seq_cst);  // none opens again (failure_)
    }
  }
  failTaken(status);
  device_.abandon();  // Note [Device point-to-point] F: before the tensors go
  nccl_.abandon();    // Note [NCCL point-to-point] F
  restaging_.clear();
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
    PerPeer& p = peers_[peer];
    if (transport::PeerChannel* channel = mesh_.peerChannel(peer)) channel->dropOutbox();
    std::deque<Op> receiving = takeReceives(p);
    for (const auto* ops : {&p.sending, &p.staged, &receiving, &p.reading}) {
      for (const Op& op : *ops) {
        endSpan(op, status);
        handles_.complete(op.handle, failureOf(op, status));
      }
    }
    p = PerPeer();
  }
}

}  // namespace hvd::runtime
