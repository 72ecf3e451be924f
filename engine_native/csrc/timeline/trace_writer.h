// TraceWriter: the consumer half of the timeline. It turns ring records into Chrome-trace JSON
// in Horovod's layout (a tensor is a process; NEGOTIATE_<OP> / <OP> / activity spans) and into
// finished spans for the dashboard strip. Runs on the timeline writer thread; Timeline calls
// the control methods (open/close/resetTracks) only while that thread is stopped.
// Note [Always-valid file]: the file is "[", events joined by ",\n", then "\n]\n"; each flush
// overwrites the closing bracket with the next batch followed by a new bracket.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "timeline/recent_events.h"
#include "timeline/spsc_ring.h"
#include "timeline/timeline_record.h"

namespace hvd::timeline {

class TraceWriter {
 public:
  TraceWriter(RecentEvents* live, int64_t epoch_offset_us);
  ~TraceWriter();
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Control. start_ns is the steady-clock time that becomes ts 0 in the file.
  common::Status open(const std::string& path, uint32_t session, int64_t start_ns,
                      int64_t start_epoch_us);
  void close();
  bool isOpen() const { return fd_ >= 0; }
  void setLive(bool on) { live_on_ = on; }
  void resetTracks() {
    tracks_.clear();
    group_ = Group();
  }

  // Writer thread: applies every complete record group in the ring; returns groups applied.
  size_t drain(SpscRing<TimelineRecord>& ring);
  // Writer thread: writes what drain() formatted (Note [Always-valid file]).
  void flush();

  uint64_t eventsWritten() const { return events_written_.load(std::memory_order_relaxed); }

 private:
  enum class SpanKind : uint8_t { kNegotiate, kOp, kActivity };
  struct Span {
    int64_t start_ns;
    uint32_t label;    // string id: op / activity (negotiation spans: the op)
    uint32_t session;  // file session its B event went to (0: none)
    SpanKind kind;
  };
  struct Track {  // one tensor name's open spans, indexed by its string id
    std::vector<Span> open;
    int32_t dtype = -1;
    std::vector<int64_t> shape;
  };
  struct Group {  // the response group being executed (Note [Response groups])
    bool open = false;
    uint32_t label = kNoString;
    int64_t start_ns = 0;
    std::vector<uint32_t> names;
  };

  void apply(const TimelineRecord& r, const std::string& data);
  void applyGroup(const TimelineRecord& r);
  void define(const TimelineRecord& r, const std::string& data);
  Track* track(uint32_t name);
  void openSpan(uint32_t name, Track& track, const TimelineRecord& r, SpanKind kind);
  void closeSpan(uint32_t name, Track& track, int64_t ts_ns, uint32_t error);
  bool closeAll(uint32_t name, int64_t ts_ns, uint32_t error);  // true when an op was open
  void endOp(const TimelineRecord& r);
  void rankReady(const TimelineRecord& r);
  void cycle(const TimelineRecord& r);
  void addLive(int64_t start_ns, std::string name, uint32_t op, int64_t end_ns, uint32_t error);
  const std::string& text(uint32_t id) const;

  bool toFile(uint32_t session) const { return fd_ >= 0 && session == session_; }
  int pidFor(uint32_t name);
  void beginEvent(const char* ph, int64_t ts_ns, int pid);
  void appendInt(int64_t v);
  int64_t fileTs(int64_t ts_ns) const;
  int64_t epochUs(int64_t ts_ns) const { return ts_ns / 1000 + epoch_offset_us_; }
  void writeAt(const std::string& bytes, int64_t offset);

  RecentEvents* live_;
  const int64_t epoch_offset_us_;
  bool live_on_ = false;
  std::vector<std::string> strings_;  // interned table, indexed by id
  std::vector<Track> tracks_;         // indexed by name id
  Group group_;

  // File session state.
  int fd_ = -1;
  uint32_t session_ = 0;
  int64_t start_ns_ = 0;
  int64_t close_offset_ = 0;  // where "\n]\n" starts
  std::string path_;
  std::string pending_;
  std::unordered_map<std::string, int> pids_;  // tensor name -> pid in this file
  std::vector<int> pid_cache_;                 // name id -> pid (0: look it up)
  std::atomic<uint64_t> events_written_{0};
};

// Appends s as a JSON string literal (quotes included) to out; Escaped: without the quotes.
void appendJsonString(std::string* out, const std::string& s);
void appendJsonEscaped(std::string* out, const std::string& s);

}  // namespace hvd::timeline
