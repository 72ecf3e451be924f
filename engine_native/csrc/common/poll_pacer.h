// PollPacer: the sleeps between polls of something that finishes on its own and cannot be
// waited on with a bound (a CUDA event: Note [Caller waits on the device] in
// runtime/device_executor.cc). Each nap is an eighth of the time waited so far, at least
// kMinNap and at most kMaxNap: the end is seen at most ~1/8 (+20 us) late, and a long wait
// costs at most ~1000 short wake-ups a second — engines outnumber cores, so no long busy spin.
// One pacer per wait, on the waiting thread.
#pragma once

#include <algorithm>
#include <chrono>
#include <thread>

namespace hvd::common {

class PollPacer {
  using Clock = std::chrono::steady_clock;

 public:
  PollPacer() : since_(Clock::now()) {}
  explicit PollPacer(Clock::time_point since) : since_(since) {}  // a wait that began earlier
  // Sleeps for the next nap, never past `deadline`.
  void nap(Clock::time_point deadline) const {
    const auto now = Clock::now();
    const auto pace = std::chrono::duration_cast<std::chrono::microseconds>(now - since_) / 8;
    const auto step = std::clamp<std::chrono::microseconds>(pace, kMinNap, kMaxNap);
    std::this_thread::sleep_until(std::min<Clock::time_point>(now + step, deadline));
  }

 private:
  static constexpr std::chrono::microseconds kMinNap{20};
  static constexpr std::chrono::microseconds kMaxNap{1000};
  Clock::time_point since_;
};

}  // namespace hvd::common
