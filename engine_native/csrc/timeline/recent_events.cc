#include "timeline/recent_events.h"

#include <algorithm>
#include <utility>

namespace hvd::timeline {

RecentEvents::RecentEvents(double window_seconds, size_t max_events)
    : window_us_(static_cast<int64_t>(std::max(0.0, window_seconds) * 1e6)),
      max_events_(std::max<size_t>(1, max_events)) {}

void RecentEvents::add(RecentEvent event) {
  std::lock_guard<std::mutex> lock(mutex_);
  const int64_t end_us = event.ts_us + event.duration_us;
  events_.push_back(std::move(event));
  pruneLocked(end_us);
}

void RecentEvents::pruneLocked(int64_t now_us) {
  while (events_.size() > max_events_) events_.pop_front();
  // Spans are added when they end, so starts are only roughly ordered: prune from the front
  // while the oldest entry is out of the window, which keeps the strip bounded either way.
  while (!events_.empty() && events_.front().ts_us + events_.front().duration_us <
                                 now_us - window_us_) {
    events_.pop_front();
  }
}

std::vector<RecentEvent> RecentEvents::snapshot(int64_t since_us, int64_t now_us) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<RecentEvent> out;
  const int64_t oldest = std::max(since_us, now_us - window_us_);
  for (const RecentEvent& e : events_) {
    if (e.ts_us + e.duration_us >= oldest && e.ts_us >= since_us) out.push_back(e);
  }
  std::stable_sort(out.begin(), out.end(), [](const RecentEvent& a, const RecentEvent& b) {
    return a.ts_us < b.ts_us;
  });
  return out;
}

void RecentEvents::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  events_.clear();
}

}  // namespace hvd::timeline
