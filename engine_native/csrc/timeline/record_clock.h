// RecordClock: the timestamps the timeline's recording calls put on their records. Owned by
// Timeline and used by the recording thread only (the background loop, the ring's single
// producer), so it has no locks or atomics. A clock read is a third of a record's cost, so
// records that happen together share one read: every record inside a ClockScope, the members
// a response group starts, and a negotiation's first rank tick (with the start it caused).
#pragma once

#include <chrono>
#include <cstdint>

#include "timeline/timeline_record.h"

namespace hvd::timeline {

class RecordClock {
 public:
  static int64_t steadyNs() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

  // The steady clock, or while frozen the time of the first read after freeze().
  int64_t now() {
    if (!frozen_) return steadyNs();
    if (frozen_ts_ns_ == 0) frozen_ts_ns_ = steadyNs();
    return frozen_ts_ns_;
  }
  void freeze() {
    frozen_ = true;
    frozen_ts_ns_ = 0;
  }
  void thaw() { frozen_ = false; }

  // Members started after a group's begin record share its time (Note [Response groups]);
  // 0 (take a fresh time) outside a group.
  void enterGroup(int64_t begin_ts_ns) {
    in_group_ = true;
    group_ts_ns_ = begin_ts_ns;
  }
  void leaveGroup() { in_group_ = false; }
  int64_t groupTime() const { return in_group_ ? group_ts_ns_ : 0; }

  // Called for every record emitted: remembers it only if it is a negotiation start, so that
  // rankReadyTime() gives that start's time to a rank tick that immediately follows it for the
  // same tensor (the arrival that caused the negotiation); 0 for any other tick.
  void noteEmitted(const TimelineRecord& record) {
    const bool negotiate = record.kind == RecordKind::kNegotiateStart;
    last_negotiate_name_ = negotiate ? record.name : kNoString;
    last_negotiate_ts_ns_ = negotiate ? record.ts_ns : 0;
  }
  int64_t rankReadyTime(uint32_t name) const {
    return name == last_negotiate_name_ ? last_negotiate_ts_ns_ : 0;
  }

 private:
  bool frozen_ = false;
  int64_t frozen_ts_ns_ = 0;
  bool in_group_ = false;
  int64_t group_ts_ns_ = 0;
  uint32_t last_negotiate_name_ = kNoString;
  int64_t last_negotiate_ts_ns_ = 0;
};

}  // namespace hvd::timeline
