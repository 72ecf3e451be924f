// StepMeter: turns the stream of allreduced tensors into training steps for the autotuner.
// A step ends when a tensor name comes round again (Horovod's rule: a training step reduces
// each gradient once). Rank 0's background loop calls observe() per executed allreduce
// tensor and feeds each finished step to ParameterManager::update(). Not thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string_view>
#include <unordered_set>

namespace hvd::autotune {

class StepMeter {
 public:
  using Clock = std::chrono::steady_clock;

  // Returns true when `name` closes a step; *step_bytes / *step_seconds then describe it
  // (bytes of the tensors before this one, time since the previous step ended). The tensor
  // that closes a step is counted in the next one.
  bool observe(std::string_view name, int64_t bytes, Clock::time_point now, int64_t* step_bytes,
               double* step_seconds) {
    const size_t key = std::hash<std::string_view>()(name);
    bool closed = false;
    if (seen_.count(key) != 0) {
      *step_bytes = bytes_;
      *step_seconds = std::chrono::duration<double>(now - step_start_).count();
      seen_.clear();
      bytes_ = 0;
      step_start_ = now;
      closed = true;
    } else if (seen_.empty() && !started_) {
      step_start_ = now;
      started_ = true;
    }
    seen_.insert(key);
    bytes_ += bytes;
    return closed;
  }

  void reset() {
    seen_.clear();
    bytes_ = 0;
    started_ = false;
  }

 private:
  std::unordered_set<size_t> seen_;
  int64_t bytes_ = 0;
  Clock::time_point step_start_;
  bool started_ = false;
};

}  // namespace hvd::autotune
