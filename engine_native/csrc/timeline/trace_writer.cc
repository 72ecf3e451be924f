#include "timeline/trace_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "common/dtype.h"
#include "common/logging.h"

namespace hvd::timeline {

namespace {

constexpr const char* kClose = "\n]\n";
constexpr size_t kFlushEarlyBytes = 1 << 20;  // flush mid-drain past this much text
constexpr size_t kMaxTracks = 1 << 17;        // guard against names that never end

const char* dtypeName(int32_t code) {
  if (!common::isValidDataType(code)) return "unknown";
  return common::dataTypeName(static_cast<common::DataType>(code));
}

std::string shapeText(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(shape[i]);
  }
  return out + "]";
}

}  // namespace

void appendJsonString(std::string* out, const std::string& s) {
  out->push_back('"');
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out->push_back('\\');
      out->push_back(static_cast<char>(c));
    } else if (c < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out->append(buf);
    } else {
      out->push_back(static_cast<char>(c));
    }
  }
  out->push_back('"');
}

TraceWriter::TraceWriter(RecentEvents* live, int64_t epoch_offset_us)
    : live_(live), epoch_offset_us_(epoch_offset_us) {}

TraceWriter::~TraceWriter() { close(); }

common::Status TraceWriter::open(const std::string& path, uint32_t session, int64_t start_ns,
                                 int64_t start_epoch_us) {
  close();
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return common::invalidArgument("start_timeline: cannot open '" + path +
                                   "' for writing: " + std::strerror(errno));
  }
  fd_ = fd;
  path_ = path;
  session_ = session;
  start_ns_ = start_ns;
  std::string header =
      "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":0,\"args\":{\"name\":\"hvd timeline\","
      "\"start_time_since_epoch_in_micros\":" +
      std::to_string(start_epoch_us) +
      "}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":0,\"args\":{\"sort_index\":0}}";
  close_offset_ = static_cast<int64_t>(header.size());
  writeAt(header + kClose, 0);
  return fd_ >= 0 ? common::Status::ok()
                  : common::internalError("start_timeline: cannot write '" + path + "'");
}

void TraceWriter::close() {
  if (fd_ < 0) return;
  flush();
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  pending_.clear();
  pids_.clear();
}

void TraceWriter::writeAt(const std::string& bytes, int64_t offset) {
  size_t done = 0;
  while (done < bytes.size() && fd_ >= 0) {
    ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done,
                         static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      HVD_LOG(kWarning, "timeline") << "timeline: writing '" << path_ << "' failed ("
                                    << std::strerror(errno) << "); the timeline is stopped";
      ::close(fd_);
      fd_ = -1;
      return;
    }
    done += static_cast<size_t>(n);
  }
}

void TraceWriter::flush() {
  if (fd_ < 0 || pending_.empty()) return;
  writeAt(pending_ + kClose, close_offset_);
  close_offset_ += static_cast<int64_t>(pending_.size());
  pending_.clear();
}

size_t TraceWriter::drain(SpscRing<TimelineRecord>& ring) {
  const size_t available = ring.readable();
  size_t i = 0;
  size_t groups = 0;
  std::string data;
  while (i < available) {
    const TimelineRecord& r = ring.consumerSlot(i);
    const size_t slots = 1 + r.extra;
    if (i + slots > available) break;  // never happens: groups are committed whole
    size_t left = r.data_bytes;
    data.assign(reinterpret_cast<const char*>(r.payload), std::min(left, kInlineBytes));
    left -= data.size();
    for (size_t k = 1; k < slots; ++k) {
      const char* raw = reinterpret_cast<const char*>(&ring.consumerSlot(i + k));
      size_t take = std::min(left, kRecordBytes);
      data.append(raw, take);
      left -= take;
    }
    apply(r, data);
    i += slots;
    ++groups;
    if (pending_.size() > kFlushEarlyBytes) flush();
  }
  ring.release(i);
  return groups;
}

const std::string& TraceWriter::text(uint32_t id) const {
  static const std::string kEmpty;
  return id < strings_.size() ? strings_[id] : kEmpty;
}

void TraceWriter::define(const TimelineRecord& r, const std::string& data) {
  if (r.name >= strings_.size()) strings_.resize(r.name + 1);
  strings_[r.name] = data;
}

void TraceWriter::apply(const TimelineRecord& r, const std::string& data) {
  if (r.kind == RecordKind::kDefine) return define(r, data);
  if (r.kind == RecordKind::kCycle) return cycle(r);
  if (r.kind == RecordKind::kRankReady) return rankReady(r);
  if (r.kind == RecordKind::kOpEnd) return endOp(r);
  const std::string& name = text(r.name);
  if (tracks_.size() > kMaxTracks) tracks_.clear();
  Track& track = tracks_[name];
  const SpanKind top = track.open.empty() ? SpanKind::kOp : track.open.back().kind;
  switch (r.kind) {
    case RecordKind::kNegotiateStart:
      if (track.open.empty()) openSpan(r, SpanKind::kNegotiate, "NEGOTIATE_" + text(r.label));
      break;
    case RecordKind::kNegotiateEnd:
      if (!track.open.empty() && top == SpanKind::kNegotiate)
        closeSpan(name, track, r.ts_ns, "");
      break;
    case RecordKind::kOpStart:
      while (!track.open.empty()) closeSpan(name, track, r.ts_ns, "");
      track.dtype = r.value;
      track.shape.assign(reinterpret_cast<const int64_t*>(data.data()),
                         reinterpret_cast<const int64_t*>(data.data()) + data.size() / 8);
      openSpan(r, SpanKind::kOp, text(r.label));
      break;
    case RecordKind::kActivityStart:
      if (!track.open.empty() && track.open.front().kind == SpanKind::kOp)
        openSpan(r, SpanKind::kActivity, text(r.label));
      break;
    case RecordKind::kActivityEnd:
      if (!track.open.empty() && top == SpanKind::kActivity) closeSpan(name, track, r.ts_ns, "");
      break;
    default:
      break;
  }
  if (track.open.empty()) tracks_.erase(name);
}

void TraceWriter::beginEvent(const char* ph, const std::string* event_name, int64_t ts_ns,
                             int pid) {
  pending_ += ",\n{\"ph\":\"";
  pending_ += ph;
  pending_ += '"';
  if (event_name != nullptr) {
    pending_ += ",\"name\":";
    appendJsonString(&pending_, *event_name);
  }
  pending_ += ",\"ts\":" + std::to_string(fileTs(ts_ns)) + ",\"pid\":" + std::to_string(pid);
  events_written_.fetch_add(1, std::memory_order_relaxed);
}

int64_t TraceWriter::fileTs(int64_t ts_ns) const {
  return std::max<int64_t>(0, (ts_ns - start_ns_) / 1000);
}

int TraceWriter::pidFor(const std::string& name) {
  auto it = pids_.find(name);
  if (it != pids_.end()) return it->second;
  const int pid = static_cast<int>(pids_.size()) + 1;
  pids_.emplace(name, pid);
  const std::string p = std::to_string(pid);
  pending_ += ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + p + ",\"args\":{\"name\":";
  appendJsonString(&pending_, name);
  pending_ += "}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + p +
              ",\"args\":{\"sort_index\":" + p + "}}";
  return pid;
}

void TraceWriter::openSpan(const TimelineRecord& r, SpanKind kind, const std::string& label) {
  const std::string& name = text(r.name);
  Span span{r.ts_ns, kind, 0, label};
  if (toFile(r.session)) {
    beginEvent("B", &label, r.ts_ns, pidFor(name));
    pending_ += '}';
    span.session = session_;
  }
  tracks_[name].open.push_back(std::move(span));
}

void TraceWriter::closeSpan(const std::string& name, Track& track, int64_t ts_ns,
                            const std::string& error) {
  Span span = std::move(track.open.back());
  track.open.pop_back();
  if (fd_ >= 0 && span.session != 0 && span.session == session_) {
    beginEvent("E", nullptr, ts_ns, pidFor(name));
    if (span.kind == SpanKind::kOp) {
      pending_ += ",\"args\":{\"dtype\":\"";
      pending_ += dtypeName(track.dtype);
      pending_ += "\",\"shape\":\"" + shapeText(track.shape) + "\"";
      if (!error.empty()) {
        pending_ += ",\"error\":";
        appendJsonString(&pending_, error);
      }
      pending_ += '}';
    }
    pending_ += '}';
  }
  if (!live_on_) return;
  static const char* const kPhase[] = {"negotiate", "op", "activity"};
  live_->add(RecentEvent{epochUs(span.start_ns), name, kPhase[static_cast<int>(span.kind)],
                         span.label, std::max<int64_t>(0, (ts_ns - span.start_ns) / 1000),
                         span.kind == SpanKind::kOp ? error : std::string()});
}

void TraceWriter::endOp(const TimelineRecord& r) {
  const std::string& name = text(r.name);
  const std::string& error = text(r.label);  // kNoString reads as ""
  bool had_op = false;
  auto it = tracks_.find(name);
  if (it != tracks_.end()) {
    Track& track = it->second;
    had_op = !track.open.empty() && track.open.front().kind == SpanKind::kOp;
    while (!track.open.empty()) closeSpan(name, track, r.ts_ns, error);
    tracks_.erase(it);
  }
  if (had_op || error.empty()) return;
  // An op that failed before it started (e.g. a negotiation error): one ERROR tick.
  if (toFile(r.session)) {
    static const std::string kError = "ERROR";
    beginEvent("X", &kError, r.ts_ns, pidFor(name));
    pending_ += ",\"dur\":0,\"args\":{\"error\":";
    appendJsonString(&pending_, error);
    pending_ += "}}";
  }
  if (live_on_) live_->add(RecentEvent{epochUs(r.ts_ns), name, "op", "ERROR", 0, error});
}

void TraceWriter::rankReady(const TimelineRecord& r) {
  const std::string& name = text(r.name);
  const std::string rank = std::to_string(r.value);
  if (toFile(r.session)) {
    beginEvent("X", &rank, r.ts_ns, pidFor(name));
    pending_ += ",\"dur\":0,\"args\":{\"rank\":" + rank + "}}";
  }
  if (live_on_) live_->add(RecentEvent{epochUs(r.ts_ns), name, "rank_ready", rank, 0, ""});
}

void TraceWriter::cycle(const TimelineRecord& r) {
  if (!toFile(r.session)) return;
  pending_ += ",\n{\"ph\":\"i\",\"name\":\"CYCLE_START\",\"ts\":" +
              std::to_string(fileTs(r.ts_ns)) + ",\"s\":\"g\",\"pid\":0}";
  events_written_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace hvd::timeline
