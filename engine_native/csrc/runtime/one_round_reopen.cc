// Note [One round] J and K (runtime/one_round.cc): the board closed by a join opens again once
// the join completed here, every peer in the next epoch before the first post.
#include "runtime/one_round.h"

#include <algorithm>

#include "transport/peer_channel.h"
#include "transport/shm/collective_segment.h"

namespace hvd::runtime {

using common::Status;
using coord::OpType;

bool OneRound::behind(int rank, bool* gone) const {
  const uint64_t state = board_.header(rank).state.load(std::memory_order_seq_cst);
  *gone = state == transport::shm::kBoardGone;
  return !*gone && (state >> 1) < epoch_;
}

bool OneRound::peersReopened(bool* gone) const {
  bool all = true, any_gone = false;
  for (int r = 0; r < size_; ++r) {
    bool left = false;
    if (r != me_ && behind(r, &left)) all = false;
    any_gone = any_gone || left;
  }
  *gone = any_gone;
  return all || any_gone;
}

bool OneRound::waitingForReopen() const {
  return !pending_ && !closed_ && epoch_ > 0 && (!queued_.empty() || !announce_.empty());
}

void OneRound::closeForGood() {
  gone_ = true;
  reopen_due_ = false;  // never reopens
  setState(transport::shm::kBoardGone);
  wakeAll();  // peers waiting for this rank to reopen (J) stop waiting
}

Status OneRound::reopenAfterJoin(uint64_t joins, EntryTable& entries, const Route& route,
                                 const Run& run) {
  if (joins == joins_) return Status::ok();
  joins_ = joins;
  if (!active_ || gone_ || !closed_) return Status::ok();
  reopen_due_ = true;
  reopen_wait_since_ = Clock::now();  // the stall report's (K)
  return tryReopen(entries, route, run);
}

// K: a remote rank's close in this epoch may still be in flight when the join completes here.
bool OneRound::closedForJoin(int rank) const {
  const uint64_t state = board_.header(rank).state.load(std::memory_order_seq_cst);
  return state == transport::shm::kBoardGone || state >= (epoch_ << 1 | 1);
}

bool OneRound::remotesClosed() const {
  const std::vector<int>& remotes = board_.remotes();
  return std::all_of(remotes.begin(), remotes.end(), [this](int r) { return closedForJoin(r); });
}

Status OneRound::tryReopen(EntryTable& entries, const Route& route, const Run& run) {
  if (gone_ || !closed_) {  // closed for good meanwhile (shutdown, failure)
    reopen_due_ = false;
    return Status::ok();
  }
  if (!remotesClosed()) return Status::ok();
  reopen_due_ = false;
  reopen_wait_since_ = Clock::time_point{};
  if (pending_) {  // answered by every rank: all closed before this join could complete
    if (!allAnswered()) {  // not expected; peers must not wait for a reopening then (the
      closeForGood();      // round still finishes once answered, as F's pending round)
      return Status::ok();
    }
    HVD_RETURN_IF_ERROR(finish(entries, route, run, nullptr));
  }
  uint64_t base = 0;  // every counter is final: the same on every rank
  for (int r = 0; r < size_; ++r) {
    base = std::max(base, board_.header(r).posted.load(std::memory_order_seq_cst));
  }
  for (coord::Key key : queued_) {  // (none: a closed board routes at once)
    if (entries.find(key) != nullptr) route(key);
  }
  queued_.clear();
  owed_.clear();
  announce_.clear();
  // What of the global set is still pending went to negotiation and reached rank 0 after the
  // join (the join released every name pending before it; a closed board holds nothing): the
  // peers must not wait for it on the board, so the epoch's first post names it (they route
  // or owe it, A and D). A name too long to post keeps the board closed, as in F.
  // Ops held while the reopening waited (K) are taken by the open board, not named.
  bool postable = true;
  entries.forEach([&](const TensorEntry& entry) {
    if (entry.request.process_set != 0 || entry.request.type == OpType::kJoin) return;
    if (std::find(taken_.begin(), taken_.end(), entry.request.key) != taken_.end()) return;
    const std::string& name = keys_.name(entry.request.key);
    postable = postable && name.size() <= one_round::kMaxPostedName;
    announce_.push_back(name);
  });
  if (!postable) {
    announce_.clear();
    closeForGood();
    return Status::ok();
  }
  round_ = base;
  ++epoch_;
  closed_ = false;
  posted_.clear();
  setState(epoch_ << 1);
  wakeAll();  // peers whose ops wait for this rank's reopening
  return Status::ok();
}

void OneRound::wakeAll() const {
  for (int r = 0; r < size_; ++r) {
    if (r == me_) continue;
    if (const transport::PeerChannel* channel = mesh_.peerChannel(r)) channel->wakePeerLoop();
  }
}

}  // namespace hvd::runtime
