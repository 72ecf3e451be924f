// StallInspector: every 200 ms, the pending tensors of this rank into Metrics (with their age
// and, on rank 0, the ranks each still waits for); on rank 0 also the stall warning
// (HVD_STALL_CHECK_TIME) and the deadlock shutdown (Note [Deadlock shutdown] in
// coord/deadlock.cc). BackgroundLoop calls inspect() each pass that negotiates. Background
// thread only (whichever thread holds the loop's progress_).
#pragma once

#include <chrono>

#include "common/config.h"
#include "coord/key_table.h"
#include "runtime/metrics.h"
#include "runtime/one_round.h"
#include "runtime/peer_ops.h"
#include "runtime/rank_zero_coordinator.h"
#include "runtime/submission_queue.h"
#include "runtime/tensor_entry.h"

namespace hvd::runtime {

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;

  // All of these outlive the inspector; `queue` wakes the loop for a deadlock's error responses.
  StallInspector(Metrics& metrics, const common::Config& config, const coord::KeyTable& keys,
                 SubmissionQueue& queue);

  // `coordinator`: null except on rank 0.
  // `peers`: its posted receives and unfinished sends are listed with the collectives.
  // `board`: ops waiting on it list the ranks it waits for, and any rank warns of its stall.
  void inspect(EntryTable& entries, RankZeroCoordinator* coordinator, const PeerOps& peers,
               const OneRound& board);

 private:
  void failDeadlocked(RankZeroCoordinator& coordinator, Clock::time_point now);

  Metrics& metrics_;
  const common::Config& config_;
  const coord::KeyTable& keys_;
  SubmissionQueue& queue_;
  Clock::time_point last_check_;
  Clock::time_point last_report_;
  Clock::time_point last_board_report_;
};

}  // namespace hvd::runtime
