#include "timeline/timeline.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace hvd::timeline {

namespace {

constexpr size_t kMaxInterned = 1 << 14;   // ids are reused after this many distinct strings
constexpr size_t kMaxStringBytes = 4096;   // longer names are truncated
constexpr size_t kMaxDims = 64;

int64_t epochUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Timeline::Timeline(TimelineOptions options)
    : epoch_offset_us_(epochUs() - RecordClock::steadyNs() / 1000),
      ring_(options.ring_slots),
      live_events_(options.live_window_seconds, options.live_max_events),
      writer_(&live_events_, epoch_offset_us_),
      writer_thread_(&ring_, &writer_, options.flush_interval_ms) {}

Timeline::~Timeline() {
  std::lock_guard<std::mutex> lock(control_mutex_);
  enabled_.store(false);
  session_.store(0);
  writer_thread_.stop();
  writer_.close();
}

// ---- control ---------------------------------------------------------------------------------
// Every control call stops the writer thread (which first drains the ring into the current
// file), changes the writer's state on this thread, then restarts it when anything is listening.

common::Status Timeline::start(const std::string& path, bool mark_cycles) {
  std::lock_guard<std::mutex> lock(control_mutex_);
  writer_thread_.stop();
  const uint32_t session = next_session_++;
  common::Status status = writer_.open(path, session, RecordClock::steadyNs(), epochUs());
  file_open_ = status.isOk();
  path_ = file_open_ ? path : std::string();
  session_.store(file_open_ ? session : 0);
  mark_cycles_.store(file_open_ && mark_cycles);
  resumeWriterLocked();
  return status;
}

void Timeline::stop() {
  std::lock_guard<std::mutex> lock(control_mutex_);
  if (!file_open_) return;
  session_.store(0);
  mark_cycles_.store(false);
  writer_thread_.stop();
  writer_.close();
  file_open_ = false;
  path_.clear();
  resumeWriterLocked();
}

void Timeline::setLiveCapture(bool on) {
  std::lock_guard<std::mutex> lock(control_mutex_);
  if (live_ == on) return;
  writer_thread_.stop();
  live_ = on;
  if (!on) live_events_.clear();
  resumeWriterLocked();
}

void Timeline::resumeWriterLocked() {
  const bool listening = file_open_ || live_;
  writer_.setLive(live_);
  if (!listening) writer_.resetTracks();  // nothing records until the next start
  enabled_.store(listening);
  if (listening && !writer_thread_.start()) enabled_.store(false);
}

// ---- recording -------------------------------------------------------------------------------

TimelineRecord Timeline::makeRecord(RecordKind kind, int64_t ts_ns) {
  TimelineRecord r;
  std::memset(&r, 0, sizeof(r));
  r.ts_ns = ts_ns != 0 ? ts_ns : clock_.now();
  r.session = session_.load(std::memory_order_relaxed);
  r.kind = kind;
  r.name = kNoString;
  r.label = kNoString;
  return r;
}

bool Timeline::push(TimelineRecord record, const void* data, size_t bytes) {
  const size_t extra = extraSlotsFor(bytes);
  const size_t slots = 1 + extra;
  if (ring_.freeSlots(slots) < slots) return false;
  const auto* src = static_cast<const unsigned char*>(data);
  record.extra = static_cast<uint8_t>(extra);
  record.data_bytes = static_cast<uint32_t>(bytes);
  const size_t inline_bytes = std::min(bytes, kInlineBytes);
  if (src != nullptr && inline_bytes > 0) std::memcpy(record.payload, src, inline_bytes);
  ring_.producerSlot(0) = record;
  size_t offset = inline_bytes;
  for (size_t k = 1; k < slots; ++k) {
    const size_t take = std::min(bytes - offset, kRecordBytes);
    std::memcpy(static_cast<void*>(&ring_.producerSlot(k)), src + offset, take);
    offset += take;
  }
  ring_.commit(slots);
  return true;
}

void Timeline::emit(const TimelineRecord& record, const void* data, size_t bytes) {
  clock_.noteEmitted(record);
  if (push(record, data, bytes)) {
    recorded_.fetch_add(1, std::memory_order_relaxed);
  } else {
    dropped_.fetch_add(1, std::memory_order_relaxed);
  }
}

// Note [Interned strings]: the first use of a string sends a kDefine group carrying its text;
// later records carry only the id. The ring is FIFO, so the writer always sees a definition
// before its uses, and a reused id (after the table is reset) is redefined before it is reused.
// A definition that does not fit in the ring is not remembered, so the next use retries it.
bool Timeline::intern(std::string_view text, uint32_t* id, LastInterned* last) {
  if (text.size() > kMaxStringBytes) text = text.substr(0, kMaxStringBytes);
  if (last->id != kNoString && text == last->text) {
    *id = last->id;
    return true;
  }
  const uint64_t hash = InternTable::hash(text);
  uint32_t found = interned_.find(text, hash);
  if (found == InternTable::kAbsent) {
    TimelineRecord define = makeRecord(RecordKind::kDefine, /*ts_ns=*/1);  // time unused
    define.name = static_cast<uint32_t>(interned_.size());
    if (!push(define, text.data(), text.size())) return false;
    found = interned_.add(text, hash);
  }
  last->text = interned_.text(found);
  last->id = found;
  *id = found;
  return true;
}

// Resets the intern table before a call interns anything, never in the middle of one, so the
// ids a single record carries can never collide (Note [Interned strings]).
bool Timeline::recording() {
  if (!enabled()) return false;
  if (interned_.size() + 3 > kMaxInterned) {
    interned_.clear();
    last_name_.id = last_label_.id = kNoString;
  }
  return true;
}

void Timeline::negotiateStart(std::string_view name, std::string_view op) {
  if (!recording()) return;
  TimelineRecord r = makeRecord(RecordKind::kNegotiateStart);
  if (internName(name, &r.name) && internLabel(op, &r.label)) return emit(r);
  dropped_.fetch_add(1, std::memory_order_relaxed);
}

void Timeline::negotiateRankReady(std::string_view name, int rank) {
  if (!recording()) return;
  uint32_t id = kNoString;
  if (!internName(name, &id)) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  // The first arrival is recorded right after the negotiation start it caused.
  TimelineRecord r = makeRecord(RecordKind::kRankReady, clock_.rankReadyTime(id));
  r.name = id;
  r.value = rank;
  emit(r);
}

void Timeline::negotiateEnd(std::string_view name) {
  if (!recording()) return;
  TimelineRecord r = makeRecord(RecordKind::kNegotiateEnd);
  if (internName(name, &r.name)) return emit(r);
  dropped_.fetch_add(1, std::memory_order_relaxed);
}

void Timeline::start(std::string_view name, std::string_view op, common::DataType dtype,
                     const int64_t* shape, size_t dims) {
  if (!recording()) return;
  TimelineRecord r = makeRecord(RecordKind::kOpStart, clock_.groupTime());
  r.value = static_cast<int32_t>(dtype);
  dims = std::min(dims, kMaxDims);
  if (internName(name, &r.name) && internLabel(op, &r.label)) {
    return emit(r, shape, dims * sizeof(int64_t));
  }
  dropped_.fetch_add(1, std::memory_order_relaxed);
}

void Timeline::startUntyped(std::string_view name, std::string_view op) {
  if (!recording()) return;
  TimelineRecord r = makeRecord(RecordKind::kOpStart, clock_.groupTime());
  r.value = -1;  // no dtype: the writer names it "unknown"
  if (internName(name, &r.name) && internLabel(op, &r.label)) return emit(r, nullptr, 0);
  dropped_.fetch_add(1, std::memory_order_relaxed);
}

void Timeline::activityStart(std::string_view name, std::string_view activity) {
  if (!recording()) return;
  TimelineRecord r = makeRecord(RecordKind::kActivityStart);
  if (internName(name, &r.name) && internLabel(activity, &r.label)) return emit(r);
  dropped_.fetch_add(1, std::memory_order_relaxed);
}

void Timeline::activityEnd(std::string_view name) {
  if (!recording()) return;
  TimelineRecord r = makeRecord(RecordKind::kActivityEnd);
  if (internName(name, &r.name)) return emit(r);
  dropped_.fetch_add(1, std::memory_order_relaxed);
}

void Timeline::end(std::string_view name, std::string_view error) {
  clock_.leaveGroup();
  if (!recording()) return;
  TimelineRecord r = makeRecord(RecordKind::kOpEnd);
  if (internName(name, &r.name) && (error.empty() || internLabel(error, &r.label))) return emit(r);
  dropped_.fetch_add(1, std::memory_order_relaxed);
}

// Note [Response groups]: the executor records a fused batch of k tensors as beginGroup, k
// starts, one record per activity boundary and one end, instead of k records for each: the
// background thread's cost stays near one record per tensor however many activities a batch
// has. The writer expands each group record into every member's B/E events.
void Timeline::recordLabel(RecordKind kind, std::string_view label) {
  clock_.leaveGroup();
  if (!recording()) return;
  TimelineRecord r = makeRecord(kind);
  if (!label.empty() && !internLabel(label, &r.label)) {
    dropped_.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  emit(r);
  // Members started now share the group's time: they start together (one clock read).
  if (kind == RecordKind::kGroupBegin) clock_.enterGroup(r.ts_ns);
}

void Timeline::beginGroup(std::string_view op) { recordLabel(RecordKind::kGroupBegin, op); }

void Timeline::activityStartGroup(std::string_view activity) {
  recordLabel(RecordKind::kGroupActivityStart, activity);
}

void Timeline::activityEndGroup() { recordLabel(RecordKind::kGroupActivityEnd, {}); }

void Timeline::endGroup(std::string_view error) { recordLabel(RecordKind::kGroupEnd, error); }

void Timeline::markCycle() {
  if (!markingCycles()) return;
  emit(makeRecord(RecordKind::kCycle));
}

// ---- readers ---------------------------------------------------------------------------------

std::vector<RecentEvent> Timeline::recentEvents(int64_t since_us) const {
  return live_events_.snapshot(since_us, epochUs());
}

TimelineStats Timeline::stats() const {
  std::lock_guard<std::mutex> lock(control_mutex_);
  TimelineStats s;
  s.recorded = recorded_.load(std::memory_order_relaxed);
  s.dropped = dropped_.load(std::memory_order_relaxed);
  s.written = writer_.eventsWritten();
  s.file_open = file_open_;
  s.live = live_;
  s.path = path_;
  return s;
}

}  // namespace hvd::timeline
