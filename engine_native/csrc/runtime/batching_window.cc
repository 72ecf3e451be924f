// The batching window of BackgroundLoop (rank 0 only): how long released allreduces are held
// so that more fuse with them, and the step memory that keeps a repeated step in one batch.
// Background thread only. See background_loop.h and Note [Batching window].
#include "coord/fusion.h"
#include "runtime/background_loop.h"

namespace hvd::runtime {

using Clock = std::chrono::steady_clock;

// Note [Batching window]: HVD_CYCLE_TIME_MS is how long rank 0 may hold released responses so
// that allreduces still arriving fuse with them. It holds only while more can become ready
// soon: some allreduce has been submitted by part of its set, or the held tensors belong to
// the previous step and some of that step's tensors have not been submitted yet (a step =
// allreduces in flight together; ranks submitting in lockstep would otherwise cut a step
// wherever rank 0 happens to see every rank at the same tensor). The batch must still fuse and
// be under the threshold: a lone tensor, sequential ops, or the last tensor of a step are sent
// at once. Otherwise the window stays open while requests keep arriving less than a cycle
// apart, up to kMaxWindowCycles cycles after the first release (windowEnd).
bool BackgroundLoop::holdForWindow() const {
  if (cycle_time_ms_ <= 0 || fusion_threshold_ <= 0) return false;
  int64_t bytes = 0;
  bool fusable = false;
  for (const auto& r : held_) {
    if (r.type != coord::OpType::kAllreduce || r.status != coord::ResponseType::kOk) continue;
    fusable = true;
    bytes += coord::responseBytes(r);
  }
  if (!fusable || bytes >= fusion_threshold_) return false;
  const bool repeating = heldRepeatsLastStep();
  if (negotiating_allreduces_ == 0 && !(repeating && lastStepIncomplete())) return false;
  return Clock::now() < windowEnd(repeating);
}

bool BackgroundLoop::heldRepeatsLastStep() const {
  for (const auto& r : held_) {
    if (r.type == coord::OpType::kAllreduce && !r.names.empty() &&
        last_step_.count({r.process_set, r.names.front()}) > 0) {
      return true;
    }
  }
  return false;
}

bool BackgroundLoop::lastStepIncomplete() const {
  for (const auto& key : last_step_) {
    if (this_step_.count(key) == 0) return true;
  }
  return false;
}

// Step memory. A step ends when rank 0 has nothing in flight after executing (no name
// negotiating, held or queued, no own tensor pending) or when a name of it is released again
// (the next step began before rank 0 saw a pause). Its allreduce names are what the next step
// is expected to release.
// A stream that never pauses with fresh names has no steps: the memory is bounded.
void BackgroundLoop::noteStepBoundary() {
  constexpr size_t kMaxStepNames = 1 << 16;
  if (this_step_.size() > kMaxStepNames) {
    this_step_.clear();
    last_step_.clear();
  }
  if (this_step_.empty() || !negotiating_.empty() || !held_.empty() || !entries_.empty() ||
      !to_execute_.empty()) {
    return;
  }
  last_step_.swap(this_step_);
  this_step_.clear();
}

void BackgroundLoop::noteStepRelease(const EntryKey& key) {
  if (this_step_.insert(key).second) return;
  last_step_.swap(this_step_);
  this_step_.clear();
  this_step_.insert(key);
}

// A repeated step is held until it is complete or the cap passes (a rank descheduled for a
// while must not cut it); anything else until arrivals pause for a cycle, at most the cap.
std::chrono::steady_clock::time_point BackgroundLoop::windowEnd(bool repeating) const {
  constexpr int kMaxWindowCycles = 5;
  const auto cycle = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double, std::milli>(cycle_time_ms_));
  const auto cap = held_since_ + kMaxWindowCycles * cycle;
  return repeating ? cap : std::min(std::max(held_since_, last_arrival_) + cycle, cap);
}

}  // namespace hvd::runtime
