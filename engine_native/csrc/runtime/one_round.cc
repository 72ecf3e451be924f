// Note [One round]
// A negotiated small op costs three hand-offs in sequence: the worker's request to rank 0,
// rank 0's response, then the op's own exchange of data. The ranks instead agree on the global
// set's ops and exchange their data in one round on a board: in the host collective segment
// within a host, by a frame to each rank beyond it (K) (issue #38):
//   A. Each rank owns two post slots and a header (BoardHeader: the round it posted last, a
//      closed flag). A rank takes the global set's drained ops in order. A data op (a blocking
//      CPU allreduce, broadcast, allgather, alltoall or reducescatter, not in a group, whose
//      input is at most HVD_ONE_ROUND_BYTES, the least of every rank's wish) waits for its
//      next round r and is posted there, in slot r % 2, as kData: its name, parameters and
//      data (a broadcast's root alone carries data). Any other op goes to negotiation at once
//      and its name is posted with the next round as kNegotiate, so nothing that a peer may
//      wait for in negotiation waits for a round here. A rank posts round r + 1 only once
//      every rank answered round r (posted it, or closed without it), and every rank reads
//      round r before it posts r + 1, so a slot is never rewritten while someone may still
//      read it: two suffice.
//   B. What a rank may assume when it writes its data before it knows the others agree:
//      nothing, and it needs nothing. Once every rank answered round r, every rank reads the
//      same posts and decides alike, op by op: a kData op is run here (one_round ops) iff every
//      rank posted it as kData with byte-equal parameters (dim 0 aside for allgather and
//      alltoall), rank 0's validation (coord::buildResponse) accepts the requests the posts
//      spell (runtime/one_round_respond.cc answers most ops from the posts directly; the fuzz
//      target one_round_respond holds it to that validation), and no rank closed without
//      posting; every other op of the round, on every rank that posted it, goes to rank 0's
//      negotiation, which reports mismatches as before. So an op is never run twice nor on
//      one path by some ranks and on the other by the rest.
//   C. The result is computed by every rank from the same bytes in the same order (each rank's
//      prescaled input, folded in rank order from rank 0's, then the post factor, as
//      algo/allreduce_small.cc does; a reducescatter keeps its block of that): the ranks cannot
//      disagree on a bit. Gathers copy the blocks op_layout.h places, as negotiated ops do.
//   D. Owed ops. A rank that finds in round r ops it did not post there (another rank took
//      them sooner) owes them: its next op of that name goes straight to negotiation, unposted,
//      as the others' did, at once (also when it is queued behind the next round already).
//      Otherwise it would post the op in a later round and wait for ranks that already sent
//      theirs to rank 0 and may post nothing more: a deadlock (test_one_round's owed case). An
//      occurrence of a name is therefore in the posts of one round at most, so one count per
//      name is exact.
//   E. Liveness. A round completes once every rank posted it; a rank posts as soon as it has
//      any op of the global set, and every op of it is posted or owed: a rank that waits on
//      round r waits for ops the others have not submitted yet, as negotiation would. Nothing
//      blocks: step() never waits, the loop keeps coordinating, executing and moving
//      point-to-point bytes. A rank whose post others may wait on wakes their loops (their
//      point-to-point doorbell, shm::wakeLoop), and a sleeping loop re-checks canProgress()
//      after announcing its sleep (Note [Doorbell ordering]: a post's header store and the
//      sleeper's flag are both seq_cst).
//   F. Closing. A join (from then on a rank submits nothing until every rank joined), a name
//      too long to post, shutdown and failure set the rank's closed flag: it posts no more, so
//      it is absent from its next round, and every rank closes after a round with an absent
//      rank. A closed board routes every op to negotiation until a join opens it again (J);
//      shutdown and failure close it for good (kBoardGone); a pending round still finishes.
//   G. Unchanged: process sets other than the global one, device tensors, async ops (the
//      gradients of a step, which rank 0 fuses), groups (fused by rank 0 into one op). A
//      round waits only on ranks that submitted no op
//      of the global set since (names they did submit went to negotiation); the waiting rank's
//      stall warning and metrics()' pending list name them (StallInspector). The deadlock
//      shutdown (HVD_STALL_SHUTDOWN_TIME) judges from rank 0's tables, which board ops never
//      reach, so a rank that sets it asks for no board (transport/mesh.cc): every op is
//      negotiated, as the shutdown needs.
//   H. Completion order: a board op completes when its round does, so a blocking op may
//      finish before an async op its rank submitted earlier and that is still negotiated (as
//      ops of two process sets always could). A barrier is negotiated after the async ops
//      submitted before it, so it still finishes after them (and a blocking op has finished
//      before its thread can call barrier()).
//   I. A failure (abort, a lost peer) first finishes a round every rank answered: its ops
//      finished on the ranks that read it, so they finish here too (BackgroundLoop::fail).
//      (test_one_round_failure holds a rank off such a round until its failure comes.)
//   J. Reopening. When the global set's join completes on a rank, every rank has closed
//      (each closes as it takes its join op, before its join request leaves), so every posted
//      counter is final and every pending round is answered. The rank finishes its pending
//      round, then opens its board in the next epoch (header `state`: epoch << 1 | closed, one
//      word), its rounds going on from the largest counter any rank posted (the same number on
//      every rank), and forgets what it owed (the join resolved it); the global set's ops it
//      still has pending reached rank 0 after the join, so its first post names them (a second
//      thread's op sent on by the closed board: peers must not wait for it on the board). This
//      happens as the join executes, so every op its caller submits after join() returns is
//      taken by the open board. It posts the epoch's first round only once every peer's board
//      is in the epoch: a peer still in the old one may be reading an old slot, and reopens when
//      its own join completes (a peer gone for good instead closes this board again). Seen from
//      a round of epoch E: a peer in an older epoch has not answered yet; one in a later epoch
//      answered (closed in E, its counter final: nobody posts in E + 1 before this rank is in
//      it). Without this a join closed the board for the rest of the session, and every small
//      op after an epoch's join paid negotiation again.
//   K. Across hosts. A rank off this host's collective segment (on another host, or on this one
//      without a segment, as under HVD_TRANSPORT=tcp) cannot read the board, so each rank keeps
//      a mirror of every such rank's part (BoardMembers) and tells those ranks its own: each
//      post, as it lands in its slot, goes to them as a kBoardPost frame, and each change of
//      its state word (closed, a new epoch, gone) as a kBoardState frame, on the pair's
//      point-to-point connection (PeerOps::sendBoard). The connection is one ordered stream,
//      so a mirror changes in the order its owner's header did; the frame is the agreement and
//      the data at once, the first TCP message of the op. A-I hold as written, the mirror read
//      where the segment was: a rank posts r + 2 only once every rank answered r + 1, and a
//      remote rank answers r + 1 after it read r, so a mirror's two slots suffice as the
//      segment's do. The limit (HVD_ONE_ROUND_BYTES) is agreed by the whole world at connect
//      (transport/board_agreement.h), so the board is on for every rank or for none. A frame
//      wakes its receiver's loop: through the socket, which the loop polls, or on a ring (the
//      same host without a segment) by a wake it always sends (PeerChannel's Outgoing::wakes);
//      a caller driving its op (Note [Caller drives] D) reads the remote ranks' sockets on each
//      pass while its round waits, and any pass that read a frame steps the board at once.
//      What is new is that frames are not ordered against rank 0's messages, which travel on
//      other connections. J and I relied on that. J: a rank closes before its join request
//      leaves, so on one host its close is visible before the join completes anywhere; its frame
//      may still be in flight when the join completes here. The reopening therefore waits
//      (reopen_due_) until every remote rank's state shows it closed in this epoch (its counter
//      final, as J needs), and holds the ops its callers submit meanwhile rather than routing
//      them, so that they are still taken by the open board. B needs no order (it decides from
//      the posts alone), nor D (owed names go to negotiation, which waits for every rank). I:
//      a rank learns of a failure from rank 0 or a lost connection, maybe before a post
//      sent earlier has arrived (one host's rank may be descheduled between its frames to two
//      others). So a failing rank first reads, for up to a second, the posts of remote ranks
//      that have not answered its round, from connections still open (BackgroundLoop::
//      awaitBoardPosts): each such rank sent its post before anything it did later, or closes
//      (a frame) once it fails too, so the wait lasts as long as frames take. Only a rank lost
//      in the middle of sending, or stopped for that second, can leave two survivors
//      disagreeing on whether the round's ops finished.
#include "runtime/one_round.h"

#include <algorithm>
#include <cstring>

#include "common/byte_codec.h"
#include "common/test_switch.h"
#include "coord/validation.h"
#include "runtime/one_round_respond.h"

#include "transport/peer_channel.h"
#include "transport/shm/collective_segment.h"

namespace hvd::runtime {

using common::Status;
using coord::OpType;
using one_round::PostedOp;
using one_round::PostKind;

namespace {

constexpr size_t kIndexedPost = 16;  // posts with more ops are looked up through a map

size_t opBytes(const coord::Request& r) { return static_cast<size_t>(coord::requestBytes(r)); }

bool reduces(OpType type) { return type == OpType::kAllreduce || type == OpType::kReducescatter; }

// A: the ops whose data may ride on the board (validation decides the rest, B).
bool boardTakes(const coord::Request& r) {
  switch (r.type) {
    case OpType::kAllreduce:
      return r.reduce_op != common::ReduceOp::kAdasum &&
             common::checkReducible(r.dtype, r.reduce_op).isOk();
    case OpType::kReducescatter:
      return !r.shape.empty() && common::checkReducible(r.dtype, r.reduce_op).isOk() &&
             (r.reduce_op == common::ReduceOp::kSum || r.reduce_op == common::ReduceOp::kAverage);
    case OpType::kBroadcast:
      return true;
    case OpType::kAllgather:
    case OpType::kAlltoall:
      return !r.shape.empty();
    default:
      return false;
  }
}


}  // namespace

OneRound::OneRound(transport::Mesh& mesh, const coord::KeyTable& keys)
    : mesh_(mesh), keys_(keys), board_(mesh), me_(mesh.rank()), size_(mesh.size()) {
  max_bytes_ = mesh.oneRoundBytes();  // the same on every rank (K)
  if (size_ < 2 || max_bytes_ == 0) return;
  active_ = true;
  begin_.resize(static_cast<size_t>(size_) + 1);
  absent_.resize(static_cast<size_t>(size_));
  index_.resize(static_cast<size_t>(size_));
  inputs_.by_rank.resize(static_cast<size_t>(size_));
  ops_of_.resize(static_cast<size_t>(size_));
  for (int r = 0; r < size_; ++r) members_.push_back(r);
  // Test switch HVD_TEST_ONE_ROUND_HOLD=<posted name, e.g. allreduce.x> (one rank): a round
  // this rank posted that op in is read only by a failure (I), as by a rank descheduled
  // between the last answer and its own read.
  if (const char* held = HVD_TEST_SWITCH("ONE_ROUND_HOLD")) hold_for_tests_ = held;
}

bool OneRound::answered(int rank) const {
  const transport::shm::BoardHeader& h = board_.header(rank);
  const uint64_t state = h.state.load(std::memory_order_seq_cst);
  if (state == transport::shm::kBoardGone) return true;
  if ((state >> 1) != epoch_) return (state >> 1) > epoch_;  // J
  // A rank closes after its last post, so decodeAll's later read of `posted` tells which.
  return h.posted.load(std::memory_order_seq_cst) >= round_ || (state & 1) != 0;
}

Status OneRound::arrived(int peer, const transport::PeerMessage& message) {
  fresh_ = true;
  return board_.arrived(peer, message);
}

bool OneRound::canProgress() const {
  if (reopen_due_) return remotesClosed();  // K
  if (!pending_) {
    bool gone = false;
    return waitingForReopen() && peersReopened(&gone);
  }
  return allAnswered() && !heldForTests();
}

bool OneRound::allAnswered() const {
  for (int r = 0; r < size_; ++r) {
    if (r != me_ && !answered(r)) return false;
  }
  return true;
}

bool OneRound::heldForTests() const {
  if (hold_for_tests_.empty()) return false;  // (always, unless the test switch is set)
  for (coord::Key key : posted_) {
    if (keys_.name(key) == hold_for_tests_) return true;
  }
  return false;
}

std::vector<int> OneRound::missingRanks() const {
  std::vector<int> missing;
  if (reopen_due_) {  // K: remote ranks whose close in this epoch has not arrived
    for (int r : board_.remotes()) {
      if (!closedForJoin(r)) missing.push_back(r);
    }
    return missing;
  }
  const bool reopening = waitingForReopen();
  for (int r = 0; (pending_ || reopening) && r < size_; ++r) {
    bool gone = false;
    if (r != me_ && (pending_ ? !answered(r) : behind(r, &gone))) missing.push_back(r);
  }
  return missing;
}

std::vector<int> OneRound::remotesUnanswered() const {
  std::vector<int> missing;
  for (int r : board_.remotes()) {
    if (pending_ && !answered(r)) missing.push_back(r);
  }
  return missing;
}

bool OneRound::holds(coord::Key key) const {
  return (pending_ && std::find(posted_.begin(), posted_.end(), key) != posted_.end()) ||
         std::find(queued_.begin(), queued_.end(), key) != queued_.end() ||
         (reopen_due_ && std::find(taken_.begin(), taken_.end(), key) != taken_.end());  // K
}

// G: a round waits only on ranks that have submitted no op of the global set since (a rank
// that submitted other names posted them, and the names went to negotiation, whose stall and
// deadlock reports see them), so this says which and for what.
std::string OneRound::stallReport(double seconds) const {
  const std::vector<int> missing = missingRanks();
  const Clock::time_point since = pending_ ? posted_at_ : reopen_wait_since_;
  if (missing.empty() || since == Clock::time_point{}) return "";
  const double waited = std::chrono::duration<double>(Clock::now() - since).count();
  if (waited < seconds) return "";
  std::string ranks, names;
  for (int r : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
  for (coord::Key key : pending_ ? posted_ : reopen_due_ ? taken_ : queued_) {  // J, K
    names += (names.empty() ? "" : ", ") + keys_.name(key);
  }
  const std::string head = "rank " + std::to_string(me_) + " has waited " +
                           std::to_string(static_cast<int>(waited)) +
                           " s on the one-round board for rank(s) " + ranks;
  if (reopen_due_) {  // K
    return head + ", whose close for the join has not arrived from its host; waiting: " +
           names + " (Note [One round] K).";
  }
  if (!pending_) {  // J
    return head + ", whose join has not completed yet (the board reopens on every rank after " +
           "a join); waiting: " + names + " (Note [One round] J).";
  }
  return head + ", which submitted no op of the global set since; waiting: " + names +
         ". Make sure every rank submits these ops (Note [One round] G).";
}

Status OneRound::step(EntryTable& entries, const Route& route, const Run& run,
                      timeline::Timeline* timeline) {
  if (reopen_due_) {  // K: held until the remote ranks' closes arrive
    HVD_RETURN_IF_ERROR(tryReopen(entries, route, run));
    if (reopen_due_) return Status::ok();
  }
  sortTaken(entries, route);
  for (int turn = 0; turn < 4; ++turn) {  // finish, post, finish if the others were first...
    if (pending_) {
      if (!canProgress()) return Status::ok();
      HVD_RETURN_IF_ERROR(finish(entries, route, run, timeline));
    }
    if (closed_) {  // F
      for (coord::Key key : queued_) {
        if (entries.find(key) != nullptr) route(key);
      }
      queued_.clear();
      return Status::ok();
    }
    if (queued_.empty() && announce_.empty()) return Status::ok();
    bool gone = false;
    if (!peersReopened(&gone)) {  // J: wait for the peers' reopening
      if (reopen_wait_since_ == Clock::time_point{}) reopen_wait_since_ = Clock::now();
      return Status::ok();
    }
    reopen_wait_since_ = Clock::time_point{};
    if (gone) {
      closeNow();
      continue;  // routes what is queued (above)
    }
    post(entries, timeline);
  }
  return Status::ok();
}

// A: what needs no board goes to negotiation at once, even behind a pending round (its name is
// posted with the next round); only data ops wait for it. So nothing a peer may wait for in
// negotiation waits here (D: owed names too).
void OneRound::sortTaken(EntryTable& entries, const Route& route) {
  for (coord::Key key : taken_) {
    const TensorEntry* entry = entries.find(key);
    if (entry == nullptr) continue;  // completed meanwhile (the core failed)
    if (closed_) {
      route(key);
      continue;
    }
    const std::string& name = keys_.name(key);
    auto owed = owed_.find(name);
    if (owed != owed_.end()) {  // D
      if (--owed->second == 0) owed_.erase(owed);
      route(key);
      continue;
    }
    const coord::Request& r = entry->request;
    if (r.type == OpType::kJoin || name.size() > one_round::kMaxPostedName) {  // F
      route(key);
      closeNow();
      continue;
    }
    const size_t bytes = opBytes(r);
    if (entry->caller_waits && !entry->grouped && r.device < 0 && bytes > 0 &&
        bytes <= static_cast<size_t>(max_bytes_) && entry->input != nullptr && boardTakes(r)) {
      queued_.push_back(key);
      continue;
    }
    route(key);
    announce_.push_back(name);
  }
  taken_.clear();
}

void OneRound::post(EntryTable& entries, timeline::Timeline* timeline) {
  const size_t capacity = transport::shm::kBoardSlotBytes;
  writer_.begin(round_ + 1);
  posted_.clear();
  size_t named = 0;
  while (named < announce_.size() && writer_.addNegotiate(announce_[named], capacity)) ++named;
  announce_.erase(announce_.begin(), announce_.begin() + static_cast<std::ptrdiff_t>(named));
  size_t taken = 0;
  for (; taken < queued_.size(); ++taken) {
    const coord::Key key = queued_[taken];
    const TensorEntry* entry = entries.find(key);
    if (entry == nullptr) continue;  // completed meanwhile (the core failed)
    const std::string& name = keys_.name(key);
    const coord::Request& r = entry->request;
    const size_t bytes = opBytes(r);
    // C: whose bytes are read (a broadcast's root only)
    const bool carries = r.type != OpType::kBroadcast || r.root_rank == me_;
    if (!writer_.addData(name, r, entry->input, carries ? bytes : 0, capacity)) break;  // full
    if (reduces(r.type) && r.prescale != 1.0) {
      common::scaleInPlace(writer_.lastData(), bytes / common::dataTypeSize(r.dtype), r.dtype,
                           r.prescale);
    }
    posted_.push_back(key);
    if (timeline != nullptr) {
      timeline->negotiateStart(name, coord::opTypeName(r.type));
      timeline->negotiateRankReady(name, me_);
    }
  }
  queued_.erase(queued_.begin(), queued_.begin() + static_cast<std::ptrdiff_t>(taken));
  if (writer_.count() == 0) return;
  const std::string& bytes = writer_.finish();
  std::memcpy(board_.ownSlot(round_ + 1), bytes.data(), bytes.size());
  ++round_;
  board_.ownHeader().posted.store(round_, std::memory_order_seq_cst);  // E: publishes it
  for (int r : board_.remotes()) {  // K
    send_(r, transport::PeerFrameKind::kBoardPost, static_cast<int64_t>(round_), bytes);
  }
  pending_ = true;
  posted_at_ = std::chrono::steady_clock::now();
  wakeWaiting(round_);
}

// F: from now on this rank posts nothing; ranks that posted the next round stop waiting for it
// (its own pending round still finishes: every rank may have posted it).
void OneRound::closeNow() {
  if (closed_) return;
  closed_ = true;
  setState(epoch_ << 1 | 1);
  wakeWaiting(round_ + 1);
}

void OneRound::setState(uint64_t state) {
  board_.ownHeader().state.store(state, std::memory_order_seq_cst);
  if (board_.remotes().empty()) return;
  std::string word;
  common::ByteWriter(&word).u64(state);
  for (int r : board_.remotes()) send_(r, transport::PeerFrameKind::kBoardState, 0, word);
}

// Wakes the loops of ranks that posted `round` already: this post may be the one they wait on.
void OneRound::wakeWaiting(uint64_t round) const {
  for (int r = 0; r < size_; ++r) {
    if (r == me_) continue;
    if (board_.header(r).posted.load(std::memory_order_seq_cst) < round) continue;
    if (const transport::PeerChannel* channel = mesh_.peerChannel(r)) channel->wakePeerLoop();
  }
}

Status OneRound::decodeAll() {
  ops_.clear();
  for (int r = 0; r < size_; ++r) {
    begin_[static_cast<size_t>(r)] = ops_.size();
    index_[static_cast<size_t>(r)].clear();
    absent_[static_cast<size_t>(r)] =
        board_.header(r).posted.load(std::memory_order_seq_cst) < round_;
    if (absent_[static_cast<size_t>(r)]) continue;  // closed without posting it (F)
    size_t capacity = 0;
    const uint8_t* post = board_.post(r, round_, &capacity);
    Status s = one_round::decodePost(post, capacity, round_, &ops_);
    if (!s.isOk()) {
      return common::internalError("rank " + std::to_string(r) + "'s one-round post: " +
                                   s.message());
    }
    const size_t first = begin_[static_cast<size_t>(r)];
    if (ops_.size() - first > kIndexedPost) {
      for (size_t i = first; i < ops_.size(); ++i) {
        index_[static_cast<size_t>(r)].emplace(ops_[i].name, i);  // the first, as the scan
      }
    }
  }
  begin_[static_cast<size_t>(size_)] = ops_.size();
  return Status::ok();
}

const PostedOp* OneRound::findIn(int rank, std::string_view name) {
  const size_t first = begin_[static_cast<size_t>(rank)];
  const size_t end = begin_[static_cast<size_t>(rank) + 1];
  if (end - first > kIndexedPost) {
    const auto& index = index_[static_cast<size_t>(rank)];
    auto it = index.find(name);
    return it == index.end() ? nullptr : &ops_[it->second];
  }
  for (size_t i = first; i < end; ++i) {
    if (ops_[i].name == name) return &ops_[i];
  }
  return nullptr;
}

Status OneRound::finish(EntryTable& entries, const Route& route, const Run& run,
                        timeline::Timeline* timeline) {
  pending_ = false;
  HVD_RETURN_IF_ERROR(decodeAll());
  bool close = false;
  for (int r = 0; r < size_; ++r) close = close || absent_[static_cast<size_t>(r)];
  // B: this rank's kData ops, in its post order (its kNegotiate ones were routed at posting).
  size_t next = 0;
  for (size_t i = begin_[static_cast<size_t>(me_)]; i < begin_[static_cast<size_t>(me_) + 1];
       ++i) {
    const PostedOp& mine = ops_[i];
    if (mine.kind != PostKind::kData) continue;
    const coord::Key key = posted_[next++];
    if (timeline != nullptr) {  // every rank answered; a rank 0 negotiation may follow
      for (int r = 0; r < size_; ++r) {
        if (r == me_ || absent_[static_cast<size_t>(r)]) continue;
        timeline->negotiateRankReady(mine.name, r);
      }
      timeline->negotiateEnd(mine.name);
    }
    bool agreed = !close;
    for (int r = 0; r < size_ && agreed; ++r) {
      const PostedOp* theirs = r == me_ ? &mine : findIn(r, mine.name);
      agreed = theirs != nullptr && theirs->kind == PostKind::kData &&
               one_round::sameParams(*theirs, mine);
      inputs_.by_rank[static_cast<size_t>(r)] = agreed ? theirs->data : nullptr;
      ops_of_[static_cast<size_t>(r)] = theirs;
    }
    if (agreed && mine.type == OpType::kBroadcast) {  // the root's bytes (equal params: one root)
      agreed = mine.root_rank >= 0 && mine.root_rank < size_ &&
               inputs_.by_rank[static_cast<size_t>(mine.root_rank)] != nullptr;
    } else if (agreed) {  // every rank's
      agreed = std::find(inputs_.by_rank.begin(), inputs_.by_rank.end(), nullptr) ==
               inputs_.by_rank.end();
    }
    coord::Response response;
    if (agreed) {
      agreed = one_round::respond(mine, ops_of_, key, members_, &requests_, &response);
    }
    if (entries.find(key) == nullptr) continue;  // completed meanwhile (the core failed)
    if (!agreed) {
      route(key);
      continue;
    }
    HVD_RETURN_IF_ERROR(run(response, inputs_));
  }
  // D: what the others posted and this rank did not, it owes (one count per name and round).
  for (int r = 0; r < size_; ++r) {
    if (r == me_) continue;
    for (size_t i = begin_[static_cast<size_t>(r)]; i < begin_[static_cast<size_t>(r) + 1];
         ++i) {
      const PostedOp& op = ops_[i];
      if (findIn(me_, op.name) != nullptr) continue;
      bool seen = false;  // posted by a lower rank of this round already
      for (int q = 0; q < r && !seen; ++q) seen = q != me_ && findIn(q, op.name) != nullptr;
      if (!seen) ++owed_[std::string(op.name)];
    }
  }
  if (close) closeNow();  // F
  // D: data ops queued behind this round whose names it made owed go to negotiation now.
  for (size_t i = 0; i < queued_.size();) {
    auto owed = owed_.find(keys_.name(queued_[i]));
    if (!closed_ && owed == owed_.end()) {
      ++i;
      continue;
    }
    if (!closed_ && --owed->second == 0) owed_.erase(owed);
    if (entries.find(queued_[i]) != nullptr) route(queued_[i]);
    queued_.erase(queued_.begin() + static_cast<std::ptrdiff_t>(i));
  }
  if (closed_) {
    owed_.clear();
    announce_.clear();
  }
  return Status::ok();
}

void OneRound::close() {
  if (!active_ || gone_) return;  // (a failure closed it, then the mesh: nothing to wake)
  closeNow();
  closeForGood();
  pending_ = false;  // nothing finishes it any more (the loop's sleep re-check must not spin)
}

}  // namespace hvd::runtime
