// BatchingWindow: rank 0's batch of released responses not sent yet, how long it is held so
// that more allreduces fuse with it, and the step memory that keeps a repeated training step
// in one batch (Note [Batching window] in batching_window.cc). Owned by RankZeroCoordinator
// (rank_zero_coordinator.h), which also owns the per-name table the step stamps live in.
// Background thread only: whichever thread holds BackgroundLoop's progress_, on rank 0.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "coord/fusion.h"
#include "coord/key_table.h"
#include "coord/message.h"

namespace hvd::runtime {

// Rank 0's per-name negotiation state, in the slot of the name's key index.
struct NameState {
  coord::Key key;           // the name of the fields below (a stale slot is reset on use)
  int8_t negotiating = -1;  // OpType while requested by part of its set, else -1 (coordinator)
  uint64_t stamp = 0;       // step (Note [Batching window]) it was last released in (window)
  uint64_t prev_stamp = 0;  // the step before that one (window)
};

class BatchingWindow {
 public:
  using Clock = std::chrono::steady_clock;

  // `names` is the coordinator's per-name table (read here; stamps are written through
  // noteStepRelease).
  BatchingWindow(const std::vector<NameState>& names, int64_t fusion_threshold,
                 double cycle_time_ms);

  // The setting in force (HVD_FUSION_THRESHOLD, HVD_CYCLE_TIME_MS; autotune may change both).
  void setParams(int64_t fusion_threshold, double cycle_time_ms);
  double cycleTimeMs() const { return cycle_time_ms_; }

  // ---- the held batch ----
  bool empty() const { return held_.empty(); }
  void add(std::vector<coord::Response>&& ready, Clock::time_point now);
  std::vector<coord::Response> take() { return held_.take(); }
  const std::vector<coord::Response>& responses() const { return held_.responses(); }
  void noteArrival(Clock::time_point now) { last_arrival_ = now; }  // an allreduce admitted
  // Keep holding (Note [Batching window])? `negotiating_allreduces`: allreduce names
  // requested by part of their set; `own_blocked`: a caller of rank 0 waits and every tensor
  // rank 0 has in flight is in this batch.
  bool hold(size_t negotiating_allreduces, bool own_blocked) const;
  // When the window of the batch held now closes.
  Clock::time_point end() const { return windowEnd(heldRepeatsLastStep()); }

  // ---- step memory ----
  // After executing; `busy`: anything else in flight on rank 0 (names negotiating, own
  // tensors submitted, drained or queued).
  void noteStepBoundary(bool busy);
  void noteStepRelease(NameState& state);  // an allreduce name released
  // A name the step memory must still know when it comes round again (the last two steps').
  bool remembers(const NameState& state) const { return state.stamp + 1 >= step_; }

 private:
  bool lastStepIncomplete() const;
  bool inLastStep(coord::Key key) const;
  bool heldRepeatsLastStep() const;
  Clock::time_point windowEnd(bool repeating) const;

  const std::vector<NameState>& names_;  // RankZeroCoordinator's
  int64_t fusion_threshold_ = 0;
  double cycle_time_ms_ = 0.0;
  coord::FusionBatch held_;  // released, fused, not yet sent
  Clock::time_point held_since_;
  Clock::time_point last_arrival_;  // latest allreduce request admitted
  // Step memory (Note [Batching window]): allreduces released in the current step are the
  // names stamped step_, the previous step's those stamped step_ - 1.
  uint64_t step_ = 2;
  size_t this_step_count_ = 0;
  size_t this_step_repeats_ = 0;  // of them, names of the previous step
  size_t last_step_count_ = 0;
};

}  // namespace hvd::runtime
