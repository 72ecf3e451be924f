#include "timeline/trace_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstdio>
#include <cstring>

#include "common/dtype.h"
#include "common/logging.h"

namespace hvd::timeline {

namespace {

constexpr const char* kClose = "\n]\n";
constexpr size_t kFlushEarlyBytes = 1 << 20;  // flush mid-drain past this much text
constexpr uint32_t kMaxIds = 1 << 16;         // above the recorder's intern cap

const char* dtypeName(int32_t code) {
  if (!common::isValidDataType(code)) return "unknown";
  return common::dataTypeName(static_cast<common::DataType>(code));
}

}  // namespace

void appendJsonEscaped(std::string* out, const std::string& s) {
  const bool plain = std::none_of(s.begin(), s.end(), [](char ch) {
    const auto c = static_cast<unsigned char>(ch);
    return c == '"' || c == '\\' || c < 0x20;
  });
  if (plain) {
    out->append(s);
    return;
  }
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
}

void appendJsonString(std::string* out, const std::string& s) {
  out->push_back('"');
  appendJsonEscaped(out, s);
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
  pids_.clear();
  pid_cache_.assign(pid_cache_.size(), 0);
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
  pid_cache_.assign(pid_cache_.size(), 0);
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
  const size_t events_bytes = pending_.size();
  pending_ += kClose;
  writeAt(pending_, close_offset_);
  close_offset_ += static_cast<int64_t>(events_bytes);
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

// A reused id (the recorder's table was reset) names another string from now on: forget the
// old name's open spans and pid (Note [Interned strings] in timeline.cc).
void TraceWriter::define(const TimelineRecord& r, const std::string& data) {
  if (r.name >= kMaxIds) return;
  if (r.name >= strings_.size()) strings_.resize(r.name + 1);
  strings_[r.name] = data;
  if (r.name < tracks_.size()) tracks_[r.name] = Track();
  if (r.name < pid_cache_.size()) pid_cache_[r.name] = 0;
}

TraceWriter::Track* TraceWriter::track(uint32_t name) {
  if (name >= kMaxIds) return nullptr;
  if (name >= tracks_.size()) tracks_.resize(name + 1);
  return &tracks_[name];
}

void TraceWriter::apply(const TimelineRecord& r, const std::string& data) {
  switch (r.kind) {
    case RecordKind::kDefine: return define(r, data);
    case RecordKind::kCycle: return cycle(r);
    case RecordKind::kRankReady: return rankReady(r);
    case RecordKind::kOpEnd: return endOp(r);
    case RecordKind::kGroupBegin:
    case RecordKind::kGroupActivityStart:
    case RecordKind::kGroupActivityEnd:
    case RecordKind::kGroupEnd: return applyGroup(r);
    default: break;
  }
  Track* t = track(r.name);
  if (t == nullptr) return;
  const SpanKind top = t->open.empty() ? SpanKind::kOp : t->open.back().kind;
  switch (r.kind) {
    case RecordKind::kNegotiateStart:
      if (t->open.empty()) openSpan(r.name, *t, r, SpanKind::kNegotiate);
      break;
    case RecordKind::kNegotiateEnd:
      if (!t->open.empty() && top == SpanKind::kNegotiate) {
        closeSpan(r.name, *t, r.ts_ns, kNoString);
      }
      break;
    case RecordKind::kOpStart:
      while (!t->open.empty()) closeSpan(r.name, *t, r.ts_ns, kNoString);
      t->dtype = r.value;
      t->shape.assign(reinterpret_cast<const int64_t*>(data.data()),
                      reinterpret_cast<const int64_t*>(data.data()) + data.size() / 8);
      openSpan(r.name, *t, r, SpanKind::kOp);
      if (group_.open) group_.names.push_back(r.name);
      break;
    case RecordKind::kActivityStart:
      if (!t->open.empty() && t->open.front().kind == SpanKind::kOp) {
        openSpan(r.name, *t, r, SpanKind::kActivity);
      }
      break;
    case RecordKind::kActivityEnd:
      if (!t->open.empty() && top == SpanKind::kActivity) {
        closeSpan(r.name, *t, r.ts_ns, kNoString);
      }
      break;
    default:
      break;
  }
}

// Note [Response groups] in timeline.cc: every member gets the activity's B/E events and the
// end, as if recorded one by one; the live strip gets one "op" span for the whole response.
void TraceWriter::applyGroup(const TimelineRecord& r) {
  if (r.kind == RecordKind::kGroupBegin) {
    group_.open = true;
    group_.label = r.label;
    group_.start_ns = r.ts_ns;
    group_.names.clear();
    return;
  }
  if (!group_.open) return;
  for (uint32_t name : group_.names) {
    Track* t = track(name);
    if (t == nullptr || t->open.empty() || t->open.front().kind != SpanKind::kOp) continue;
    if (r.kind == RecordKind::kGroupActivityStart) {
      openSpan(name, *t, r, SpanKind::kActivity);
    } else if (r.kind == RecordKind::kGroupActivityEnd) {
      if (t->open.back().kind == SpanKind::kActivity) closeSpan(name, *t, r.ts_ns, kNoString);
    } else {
      closeAll(name, r.ts_ns, r.label);
    }
  }
  if (r.kind != RecordKind::kGroupEnd) return;
  group_.open = false;
  if (live_on_ && !group_.names.empty()) {
    std::string summary = text(group_.names.front());
    if (group_.names.size() > 1) {
      summary += " (+" + std::to_string(group_.names.size() - 1) + " fused)";
    }
    addLive(group_.start_ns, std::move(summary), group_.label, r.ts_ns, r.label);
  }
  group_.names.clear();
}

void TraceWriter::appendInt(int64_t v) {
  char buf[24];
  const auto res = std::to_chars(buf, buf + sizeof(buf), v);
  pending_.append(buf, res.ptr);
}

void TraceWriter::beginEvent(const char* ph, int64_t ts_ns, int pid) {
  pending_ += ",\n{\"ph\":\"";
  pending_ += ph;
  pending_ += "\",\"ts\":";
  appendInt(fileTs(ts_ns));
  pending_ += ",\"pid\":";
  appendInt(pid);
  events_written_.fetch_add(1, std::memory_order_relaxed);
}

int64_t TraceWriter::fileTs(int64_t ts_ns) const {
  return std::max<int64_t>(0, (ts_ns - start_ns_) / 1000);
}

int TraceWriter::pidFor(uint32_t name) {
  if (name < pid_cache_.size() && pid_cache_[name] > 0) return pid_cache_[name];
  const std::string& text_name = text(name);
  auto [it, fresh] = pids_.try_emplace(text_name, static_cast<int>(pids_.size()) + 1);
  const int pid = it->second;
  if (fresh) {
    pending_ += ",\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":";
    appendInt(pid);
    pending_ += ",\"args\":{\"name\":";
    appendJsonString(&pending_, text_name);
    pending_ += "}},\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":";
    appendInt(pid);
    pending_ += ",\"args\":{\"sort_index\":";
    appendInt(pid);
    pending_ += "}}";
  }
  if (name < kMaxIds) {
    if (name >= pid_cache_.size()) pid_cache_.resize(name + 1, 0);
    pid_cache_[name] = pid;
  }
  return pid;
}

void TraceWriter::openSpan(uint32_t name, Track& track, const TimelineRecord& r, SpanKind kind) {
  Span span{r.ts_ns, r.label, 0, kind};
  if (toFile(r.session)) {
    const int pid = pidFor(name);
    beginEvent("B", r.ts_ns, pid);
    pending_ += ",\"name\":\"";
    if (kind == SpanKind::kNegotiate) pending_ += "NEGOTIATE_";
    appendJsonEscaped(&pending_, text(r.label));
    pending_ += "\"}";
    span.session = session_;
  }
  track.open.push_back(span);
}

void TraceWriter::closeSpan(uint32_t name, Track& track, int64_t ts_ns, uint32_t error) {
  const Span span = track.open.back();
  track.open.pop_back();
  if (fd_ < 0 || span.session == 0 || span.session != session_) return;
  beginEvent("E", ts_ns, pidFor(name));
  if (span.kind == SpanKind::kOp) {
    pending_ += ",\"args\":{\"dtype\":\"";
    pending_ += dtypeName(track.dtype);
    pending_ += "\",\"shape\":\"[";
    for (size_t i = 0; i < track.shape.size(); ++i) {
      if (i > 0) pending_ += ", ";
      appendInt(track.shape[i]);
    }
    pending_ += "]\"";
    if (error != kNoString) {
      pending_ += ",\"error\":";
      appendJsonString(&pending_, text(error));
    }
    pending_ += '}';
  }
  pending_ += '}';
}

bool TraceWriter::closeAll(uint32_t name, int64_t ts_ns, uint32_t error) {
  Track* t = track(name);
  if (t == nullptr || t->open.empty()) return false;
  const bool had_op = t->open.front().kind == SpanKind::kOp;
  const int64_t op_start = t->open.front().start_ns;
  const uint32_t op_label = t->open.front().label;
  while (!t->open.empty()) closeSpan(name, *t, ts_ns, error);
  if (had_op && !group_.open && live_on_) addLive(op_start, text(name), op_label, ts_ns, error);
  return had_op;
}

void TraceWriter::endOp(const TimelineRecord& r) {
  const uint32_t error = r.label;
  if (closeAll(r.name, r.ts_ns, error) || error == kNoString || text(error).empty()) return;
  // An op that failed before it started (e.g. a negotiation error): one ERROR tick.
  if (toFile(r.session)) {
    beginEvent("X", r.ts_ns, pidFor(r.name));
    pending_ += ",\"name\":\"ERROR\",\"dur\":0,\"args\":{\"error\":";
    appendJsonString(&pending_, text(error));
    pending_ += "}}";
  }
  if (live_on_) addLive(r.ts_ns, text(r.name), kNoString, r.ts_ns, error);
}

// The strip's one kind of entry: a finished collective (op kNoString: an ERROR tick).
void TraceWriter::addLive(int64_t start_ns, std::string name, uint32_t op, int64_t end_ns,
                          uint32_t error) {
  live_->add(RecentEvent{epochUs(start_ns), std::move(name), "op",
                         op == kNoString ? std::string("ERROR") : text(op),
                         std::max<int64_t>(0, (end_ns - start_ns) / 1000),
                         error == kNoString ? std::string() : text(error)});
}

void TraceWriter::rankReady(const TimelineRecord& r) {
  if (!toFile(r.session)) return;
  beginEvent("X", r.ts_ns, pidFor(r.name));
  pending_ += ",\"name\":\"";
  appendInt(r.value);
  pending_ += "\",\"dur\":0,\"args\":{\"rank\":";
  appendInt(r.value);
  pending_ += "}}";
}

void TraceWriter::cycle(const TimelineRecord& r) {
  if (!toFile(r.session)) return;
  pending_ += ",\n{\"ph\":\"i\",\"name\":\"CYCLE_START\",\"ts\":";
  appendInt(fileTs(r.ts_ns));
  pending_ += ",\"s\":\"g\",\"pid\":0}";
  events_written_.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace hvd::timeline
