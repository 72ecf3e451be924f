// The steady clock at its tick's resolution (CLOCK_MONOTONIC_COARSE: a few ms, no TSC read),
// for "is it time to check again?" decisions a loop pass makes on every round: a stall check
// every 200 ms, a lost-peer check every millisecond. A full steady_clock read costs ~20 ns
// here, and a small op's passes made a dozen of them (Note [Lost peer checks] in
// runtime/loop_pass.cc). Its readings lag steady_clock's by less than one tick, never lead.
#pragma once

#include <time.h>

#include <chrono>

namespace hvd::common {

inline std::chrono::steady_clock::time_point coarseSteadyNow() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return std::chrono::steady_clock::time_point(std::chrono::seconds(ts.tv_sec) +
                                               std::chrono::nanoseconds(ts.tv_nsec));
}

}  // namespace hvd::common
