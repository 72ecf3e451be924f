// RecentEvents: the bounded in-memory strip of the last few seconds of timeline events that
// feeds the dashboard. The timeline writer thread add()s finished spans; any thread (metrics
// publisher, bindings) takes a snapshot(). Bounded by age (window) and by count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace hvd::timeline {

struct RecentEvent {
  int64_t ts_us = 0;        // start, microseconds since the Unix epoch
  std::string name;         // tensor name, or "first (+k fused)" for a fused response
  std::string phase;        // "op" (the strip holds finished collectives only)
  std::string op;           // ALLREDUCE, BROADCAST, ... or ERROR (failed before it started)
  int64_t duration_us = 0;  // 0 for instants
  std::string error;        // non-empty when an op ended with an error
};

class RecentEvents {
 public:
  RecentEvents(double window_seconds, size_t max_events);

  void add(RecentEvent event);
  // Events whose start is at or after since_us and within the window of now_us, oldest first.
  std::vector<RecentEvent> snapshot(int64_t since_us, int64_t now_us) const;
  void clear();

 private:
  void pruneLocked(int64_t now_us);

  const int64_t window_us_;
  const size_t max_events_;
  mutable std::mutex mutex_;
  std::deque<RecentEvent> events_;
};

}  // namespace hvd::timeline
