// Timeline: Chrome-trace recording of this process's collectives in Horovod's layout, plus the
// recent-events strip for the dashboard. The background loop's passes are the only recorder
// (its thread, or a caller driving it: one at a time, under the loop's progress_ lock): the
// recording calls are lock-free, never block and never format (records go into an SPSC ring;
// a full ring drops and counts). A writer thread, running only while a file or the live strip
// is on, drains the ring every 40-80 ms at a low priority (it never preempts the communication
// threads). Control calls and readers: any thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "timeline/intern_table.h"
#include "timeline/recent_events.h"
#include "timeline/record_clock.h"
#include "timeline/spsc_ring.h"
#include "timeline/timeline_record.h"
#include "timeline/trace_writer.h"
#include "timeline/writer_thread.h"

namespace hvd::timeline {

struct TimelineOptions {
  size_t ring_slots = 1 << 16;       // 64-byte slots: 4 MiB
  double live_window_seconds = 10.0;
  size_t live_max_events = 4096;
  int flush_interval_ms = 40;        // while events flow; up to 80 when idle (WriterThread)
};

struct TimelineStats {
  uint64_t recorded = 0;  // events accepted into the ring
  uint64_t dropped = 0;   // events dropped because the ring was full
  uint64_t written = 0;   // trace events written to files
  bool file_open = false;
  bool live = false;
  std::string path;
};

class Timeline {
 public:
  explicit Timeline(TimelineOptions options = TimelineOptions());
  ~Timeline();  // closes the file; the recording thread must have stopped calling by then
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // ---- control (any thread; each returns once the writer thread has applied it) ----------
  // Opens (truncates) path and writes the header; a running file is closed first.
  common::Status start(const std::string& path, bool mark_cycles);
  void stop();                    // drains what was recorded, leaves the file valid, closes it
  void setLiveCapture(bool on);   // feed recentEvents() even without a file

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  bool markingCycles() const { return mark_cycles_.load(std::memory_order_relaxed); }

  // ---- recording (the loop's passes only, under its progress_ lock: single producer) -------
  // Tensor state per name: NEGOTIATE_<op> span [rank ticks] -> <op> span [nested activities]
  // -> end. Calls out of that order are ignored by the writer; end() closes open activities.
  void negotiateStart(std::string_view name, std::string_view op);
  void negotiateRankReady(std::string_view name, int rank);
  void negotiateEnd(std::string_view name);
  void start(std::string_view name, std::string_view op, common::DataType dtype,
             const int64_t* shape, size_t dims);
  void start(std::string_view name, std::string_view op, common::DataType dtype,
             const std::vector<int64_t>& shape) {
    start(name, op, dtype, shape.data(), shape.size());
  }
  // A span whose dtype and shape are not known when it starts (a receive: they come with the
  // message); written with dtype "unknown".
  void startUntyped(std::string_view name, std::string_view op);
  void activityStart(std::string_view name, std::string_view activity);
  void activityEnd(std::string_view name);
  void end(std::string_view name, std::string_view error = std::string_view());
  void markCycle();  // CYCLE_START, only while a file opened with mark_cycles is running

  // A response executed as one unit (a fused batch or a lone tensor): beginGroup(op), then
  // start() for each member; the group calls below give every member the same activity span
  // or end, in one record each instead of one per member (Note [Response groups]).
  void beginGroup(std::string_view op);
  void activityStartGroup(std::string_view activity);
  void activityEndGroup();
  void endGroup(std::string_view error = std::string_view());

  // While frozen, every record takes the time of the first one recorded after freezeClock():
  // for a loop that records many arrivals or releases of one message (ClockScope below).
  void freezeClock() { clock_.freeze(); }
  void thawClock() { clock_.thaw(); }

  // ---- readers (any thread) ----------------------------------------------------------------
  // Finished collectives (one "op" span per response group or per lone start/end pair) and
  // ERROR ticks of the last live_window_seconds starting at or after since_us (microseconds
  // since the Unix epoch), oldest first. Filled only while live capture is on; negotiation and
  // activity detail goes to the file only.
  std::vector<RecentEvent> recentEvents(int64_t since_us = 0) const;
  TimelineStats stats() const;

 private:
  bool recording();
  struct LastInterned {  // one-entry cache in front of the table, per kind of string
    std::string_view text;  // into interned_, valid until it is cleared
    uint32_t id = kNoString;
  };
  bool intern(std::string_view text, uint32_t* id, LastInterned* last);
  bool internName(std::string_view text, uint32_t* id) { return intern(text, id, &last_name_); }
  bool internLabel(std::string_view text, uint32_t* id) {
    return intern(text, id, &last_label_);
  }
  bool push(TimelineRecord record, const void* data, size_t bytes);
  void recordLabel(RecordKind kind, std::string_view label);
  void emit(const TimelineRecord& record, const void* data = nullptr, size_t bytes = 0);
  TimelineRecord makeRecord(RecordKind kind, int64_t ts_ns = 0);
  void resumeWriterLocked();

  const int64_t epoch_offset_us_;  // steady-clock microseconds -> Unix epoch microseconds
  SpscRing<TimelineRecord> ring_;
  RecentEvents live_events_;
  TraceWriter writer_;
  // Drains ring_ into writer_; started and stopped under control_mutex_. Declared after both,
  // so it is stopped before they are destroyed.
  WriterThread writer_thread_;

  // Producer-only intern table (string -> id); reset when it grows past its cap.
  InternTable interned_;
  LastInterned last_name_;   // a tensor's rank tick often follows its negotiation start
  LastInterned last_label_;  // op and activity names repeat
  RecordClock clock_;        // producer-only: the timestamps records share

  std::atomic<bool> enabled_{false};
  std::atomic<bool> mark_cycles_{false};
  std::atomic<uint32_t> session_{0};  // file session new records belong to (0: no file)
  std::atomic<uint64_t> recorded_{0};
  std::atomic<uint64_t> dropped_{0};

  mutable std::mutex control_mutex_;  // serialises control calls; guards the fields below
  bool file_open_ = false;
  bool live_ = false;
  uint32_t next_session_ = 1;
  std::string path_;
};

// Freezes `timeline`'s clock (if any) for a scope of the recording thread: one clock read for a
// whole loop of recording calls (a clock read is a third of a record's cost).
class ClockScope {
 public:
  explicit ClockScope(Timeline* timeline) : timeline_(timeline) {
    if (timeline_ != nullptr) timeline_->freezeClock();
  }
  ~ClockScope() {
    if (timeline_ != nullptr) timeline_->thawClock();
  }
  ClockScope(const ClockScope&) = delete;
  ClockScope& operator=(const ClockScope&) = delete;

 private:
  Timeline* timeline_;
};

}  // namespace hvd::timeline
