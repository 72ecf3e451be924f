// The batching window (batching_window.h, rank 0 only): how long released allreduces are held
// so that more fuse with them, and the step memory that keeps a repeated step in one batch.
// Background thread only. Note [Batching window].
#include "runtime/batching_window.h"

#include <algorithm>

namespace hvd::runtime {

using Clock = std::chrono::steady_clock;

BatchingWindow::BatchingWindow(const std::vector<NameState>& names, int64_t fusion_threshold,
                               double cycle_time_ms)
    : names_(names), fusion_threshold_(fusion_threshold), cycle_time_ms_(cycle_time_ms) {
  held_.setThreshold(fusion_threshold_);
}

void BatchingWindow::setParams(int64_t fusion_threshold, double cycle_time_ms) {
  fusion_threshold_ = fusion_threshold;
  held_.setThreshold(fusion_threshold_);
  cycle_time_ms_ = cycle_time_ms;
}

void BatchingWindow::add(std::vector<coord::Response>&& ready, Clock::time_point now) {
  if (held_.empty()) held_since_ = now;
  held_.addAll(std::move(ready));
}

// Note [Batching window]: HVD_CYCLE_TIME_MS is how long rank 0 may hold released responses so
// that allreduces still arriving fuse with them. It holds only while more can become ready
// soon: some allreduce has been submitted by part of its set, or the held tensors belong to
// the previous step and some of that step's tensors have not been submitted yet (a step =
// allreduces in flight together; ranks submitting in lockstep would otherwise cut a step
// wherever rank 0 happens to see every rank at the same tensor). The batch must still fuse and
// be under the threshold: a lone tensor, sequential ops, or the last tensor of a step are sent
// at once. Otherwise the window stays open while requests keep arriving less than a cycle
// apart, up to kMaxWindowCycles cycles after the first release (windowEnd).
// Nor is a batch held while a caller of rank 0 is in wait() and every tensor rank 0 has in
// flight is in it: nothing more of rank 0's can join it before it is sent (the waiting thread
// submits again only after its wait), and every other rank's request for a set with rank 0
// needs rank 0's. Without that, blocking allreduces whose names once went together as a step
// (a loss, then an accuracy; or names of a training step reused one at a time) were each held
// for the missing ones until the cap: 5 cycles per op, and the missing names came only after
// it. A step whose tensors come from one thread while another waits is not blocked: that
// thread's tensors are in flight, outside the batch.
bool BatchingWindow::hold(size_t negotiating_allreduces, bool own_blocked) const {
  if (cycle_time_ms_ <= 0 || fusion_threshold_ <= 0 || own_blocked) return false;
  if (!held_.hasAllreduce() || held_.allreduceBytes() >= fusion_threshold_) return false;
  const bool repeating = heldRepeatsLastStep();
  if (negotiating_allreduces == 0 && !(repeating && lastStepIncomplete())) return false;
  return Clock::now() < windowEnd(repeating);
}

bool BatchingWindow::inLastStep(coord::Key key) const {
  if (key.index >= names_.size() || names_[key.index].key != key) return false;
  const NameState& s = names_[key.index];
  return s.stamp == step_ - 1 || (s.stamp == step_ && s.prev_stamp == step_ - 1);
}

bool BatchingWindow::heldRepeatsLastStep() const {
  for (const auto& r : held_.responses()) {
    if (r.type == coord::OpType::kAllreduce && !r.keys.empty() && inLastStep(r.keys.front())) {
      return true;
    }
  }
  return false;
}

// Every name of the previous step released again in this one?
bool BatchingWindow::lastStepIncomplete() const { return this_step_repeats_ < last_step_count_; }

// Step memory. A step ends when rank 0 has nothing in flight after executing (no name
// negotiating, held or queued, no own tensor pending) or when a name of it is released again
// (the next step began before rank 0 saw a pause). Its allreduce names are what the next step
// is expected to release. Steps are numbered; a name records the step it was last released in
// (and the one before), so membership and completeness are counters, not set lookups.
// A stream that never pauses with fresh names has no steps: past kMaxStepNames the memory is
// dropped (nothing counts as the previous step).
void BatchingWindow::noteStepBoundary(bool busy) {
  constexpr size_t kMaxStepNames = 1 << 16;
  if (this_step_count_ > kMaxStepNames) {
    step_ += 2;
    this_step_count_ = this_step_repeats_ = last_step_count_ = 0;
  }
  // Own tensors submitted but not drained yet count as pending: without that check a loop that
  // executed the first part of a step before draining the rest cut the step there.
  if (this_step_count_ == 0 || busy || !held_.empty()) return;
  last_step_count_ = this_step_count_;
  ++step_;
  this_step_count_ = this_step_repeats_ = 0;
}

void BatchingWindow::noteStepRelease(NameState& s) {
  if (s.stamp == step_) {  // released again: the next step has begun
    last_step_count_ = this_step_count_;
    ++step_;
    this_step_count_ = this_step_repeats_ = 0;
  }
  if (s.stamp == step_ - 1) ++this_step_repeats_;
  s.prev_stamp = s.stamp;
  s.stamp = step_;
  ++this_step_count_;
}

// A repeated step is held until it is complete or the cap passes (a rank descheduled for a
// while must not cut it); anything else until arrivals pause for a cycle, at most the cap.
Clock::time_point BatchingWindow::windowEnd(bool repeating) const {
  constexpr int kMaxWindowCycles = 5;
  const auto cycle = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(cycle_time_ms_));
  const auto cap = held_since_ + kMaxWindowCycles * cycle;
  return repeating ? cap : std::min(std::max(held_since_, last_arrival_) + cycle, cap);
}

}  // namespace hvd::runtime
