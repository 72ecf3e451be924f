// OneRound: this rank's side of the one-round board (Note [One round] in one_round.cc), where
// the ranks agree on small blocking ops of the global set and exchange their data in the same
// round (shared memory within a host, a frame to each rank beyond it: K), without rank 0's
// negotiation. BackgroundLoop
// hands it the global set's drained ops (take) and runs step() once a pass; what the board
// does not finish goes to negotiation through `route`, in a pass's time. Background thread only
// (whichever thread holds the loop's progress_).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "coord/key_table.h"
#include "coord/message.h"
#include "runtime/board_members.h"
#include "runtime/one_round_post.h"
#include "runtime/op_executor.h"
#include "runtime/tensor_entry.h"
#include "timeline/timeline.h"
#include "transport/mesh.h"
#include "transport/peer_frame.h"

namespace hvd::runtime {

class OneRound {
 public:
  // Queues a board frame to a rank off this host's segment (K: PeerOps::sendBoard).
  using SendFrame = std::function<void(int peer, transport::PeerFrameKind kind, int64_t tag,
                                       std::string payload)>;
  // Reads the board's setup from the connected mesh: active() is the same on every rank.
  OneRound(transport::Mesh& mesh, const coord::KeyTable& keys);
  void setSender(SendFrame send) { send_ = std::move(send); }  // before the first step

  // Every rank asked for the board (HVD_ONE_ROUND_BYTES > 0; the least of their wishes bounds
  // an op, Mesh::oneRoundBytes) and it is open, or reopens once frames in flight arrive (J, K).
  bool active() const { return active_ && (!closed_ || reopen_due_); }
  // A kBoardPost or kBoardState frame from `peer` (K). Not OK: malformed, fail the core.
  common::Status arrived(int peer, const transport::PeerMessage& message);
  // Whether a step waits on frames (K): PeerOps reads the sockets of remote ranks meanwhile.
  bool awaitsFrames() const {
    return !board_.remotes().empty() && (pending_ || reopen_due_ || waitingForReopen());
  }
  // Whether frames arrived since the last call: a step may move now.
  bool takeFresh() {
    const bool fresh = fresh_;
    fresh_ = false;
    return fresh;
  }

  // A drained op of the global set (in the order taken), sorted at the next step.
  void take(coord::Key key) { taken_.push_back(key); }

  // Sends one op to rank 0's negotiation; runs one agreed op on this rank (the Executor).
  using Route = std::function<void(coord::Key)>;
  using Run = std::function<common::Status(const coord::Response&, const OneRoundInputs&)>;
  // Finishes the round this rank posted once every rank answered it, then posts what is
  // queued. A non-OK Status (a malformed post, a failed op) is for the loop to fail the core.
  // `timeline` (rank 0's, while a file is written): a board op's NEGOTIATE_<OP> span runs from
  // its post to its round's end, with a tick per rank, as rank 0's negotiation records it.
  common::Status step(EntryTable& entries, const Route& route, const Run& run,
                      timeline::Timeline* timeline);
  // Only the first half: a round every rank answered is finished, nothing is posted (I).
  common::Status finishAnswered(EntryTable& entries, const Route& route, const Run& run) {
    return pending_ && allAnswered() ? finish(entries, route, run, nullptr)
                                     : common::Status::ok();
  }

  // After the owner announced its sleep (seq_cst): a step would move (the sleep re-check).
  bool canProgress() const;
  // The ranks that have not answered the round this rank waits on (none: it waits on none).
  std::vector<int> missingRanks() const;
  // The ranks off this host's segment (K) that have not answered this rank's pending round
  // (none without one): a segment's rank answers at once, or never (lost).
  std::vector<int> remotesUnanswered() const;
  // Whether `key` waits on the board (posted in the pending round, or queued behind it).
  bool holds(coord::Key key) const;
  // A stall warning once the pending round has waited at least `seconds`, else "".
  std::string stallReport(double seconds) const;

  // This rank posts no more (shutdown, failure): what is queued goes to `route` at the next
  // step, and peers waiting on its post stop waiting.
  void close();
  // `joins`: the global set's joins this rank has completed so far (ExecutionQueue). At a new
  // one, a board the join closed is opened again (Note [One round] J); its pending round is
  // finished first. Call before the pass's next drain.
  common::Status reopenAfterJoin(uint64_t joins, EntryTable& entries, const Route& route,
                                 const Run& run);

 private:
  bool answered(int rank) const;  // posted round_, or closed without ever posting it
  bool allAnswered() const;  // every peer answered the pending round
  bool heldForTests() const;  // the test switch holds the pending round (constructor)
  // J: `rank`'s board is still in an older epoch (*gone: closed for good instead)
  bool behind(int rank, bool* gone) const;
  // J: every peer's board is in this rank's epoch (false: wait); *gone: one never will be
  bool peersReopened(bool* gone) const;
  bool waitingForReopen() const;  // J: ops to post wait for the peers' reopening
  void sortTaken(EntryTable& entries, const Route& route);
  void post(EntryTable& entries, timeline::Timeline* timeline);
  void closeNow();
  void closeForGood();  // J: peers stop waiting for this rank to reopen
  void setState(uint64_t state);  // this rank's BoardHeader::state, here and to the remotes
  // J, K: reopens once every remote rank's close in this epoch arrived (else stays due).
  common::Status tryReopen(EntryTable& entries, const Route& route, const Run& run);
  bool remotesClosed() const;
  bool closedForJoin(int rank) const;  // K: its close in this epoch (or gone) has arrived
  common::Status finish(EntryTable& entries, const Route& route, const Run& run,
                        timeline::Timeline* timeline);
  common::Status decodeAll();
  const one_round::PostedOp* findIn(int rank, std::string_view name);
  void wakeWaiting(uint64_t round) const;
  void wakeAll() const;

  transport::Mesh& mesh_;
  const coord::KeyTable& keys_;
  BoardMembers board_;
  SendFrame send_;
  bool reopen_due_ = false;  // J, K: a join completed; the reopening waits for remote closes
  bool fresh_ = false;       // takeFresh
  using Clock = std::chrono::steady_clock;
  bool active_ = false;
  bool closed_ = false;
  bool gone_ = false;       // closed for good (shutdown, failure): never reopened (J)
  uint64_t epoch_ = 0;      // J: reopened this many times after joins
  uint64_t joins_ = 0;      // the global joins completed when last asked (reopenAfterJoin)
  Clock::time_point reopen_wait_since_{};  // J: since when a post waits for peers to reopen
  int me_ = 0;
  int size_ = 0;
  int64_t max_bytes_ = 0;
  std::string hold_for_tests_;  // HVD_TEST_ONE_ROUND_HOLD's op name (test builds only)

  uint64_t round_ = 0;    // the last round this rank posted
  bool pending_ = false;  // ... and has not finished
  Clock::time_point posted_at_;  // ... at this time
  std::vector<coord::Key> taken_;   // drained, not sorted yet
  std::vector<coord::Key> queued_;  // data ops waiting for the next post
  std::vector<std::string> announce_;  // names sent to negotiation, for the next post
  std::vector<coord::Key> posted_;  // this rank's kData ops of round_, in post order
  // Ops peers sent to negotiation that this rank has not taken yet: its next op of that name
  // goes there too (Note [One round] D).
  std::unordered_map<std::string, int> owed_;
  one_round::PostWriter writer_;
  // finish()'s scratch: every rank's ops of the round, rank r's at [begin_[r], begin_[r + 1]).
  std::vector<one_round::PostedOp> ops_;
  std::vector<size_t> begin_;
  std::vector<bool> absent_;
  std::vector<std::unordered_map<std::string_view, size_t>> index_;  // large posts only
  OneRoundInputs inputs_;  // finish()'s: the op being decided, per rank
  std::vector<const one_round::PostedOp*> ops_of_;  // per rank: its post of the op decided
  std::vector<coord::Request> requests_;            // one_round::respond()'s scratch
  std::vector<int> members_;                        // the global set: every rank
};

}  // namespace hvd::runtime
