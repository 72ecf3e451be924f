// ControlChannel (transport/control.h): length-prefixed frames over a non-blocking socket.
// A header is validated as soon as its 16 bytes arrive, before any payload is buffered, so a
// hostile or broken peer can never make this rank allocate more than kMaxControlBytes.
#include "transport/control.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string_view>

#include "common/byte_codec.h"
#include "common/test_switch.h"
#include "common/text.h"
#include "transport/tcp/socket.h"

namespace hvd::transport {

using common::Status;

namespace {

constexpr size_t kHeaderBytes = 16;
constexpr size_t kReadChunk = 64 << 10;
constexpr size_t kReadBudget = 4 << 20;  // per call, so one chatty peer cannot starve the loop
constexpr size_t kCoalesceBytes = 64 << 10;  // frames up to this are copied and sent at once

// HVD_TEST_CONTROL_END_GAP_DIR=<folder>: once, in a receive while <folder>/arm exists, stop
// between reading the ring and reading the socket, the socket taken as polled readable (as a
// left-over wake byte makes it): rename arm to in_gap, then wait (at most 60 s) for <folder>/go.
// A test lets the peer write its last frame and hang up there, in that order (Note [Control
// over shm] D). True when it stopped.
bool pauseBeforeSocketForTest() {
  static const char* folder = HVD_TEST_SWITCH("CONTROL_END_GAP_DIR");
  if (folder == nullptr) return false;
  const std::string arm = std::string(folder) + "/arm", go = std::string(folder) + "/go";
  if (::rename(arm.c_str(), (std::string(folder) + "/in_gap").c_str()) != 0) return false;
  for (int waited_ms = 0; ::access(go.c_str(), F_OK) != 0 && waited_ms < 60000; waited_ms += 10) {
    const timespec nap{0, 10 * 1000 * 1000};
    ::nanosleep(&nap, nullptr);
  }
  return true;
}

void writeHeader(std::string* out, uint32_t type, uint64_t length) {
  common::ByteWriter w(out);
  w.u32(kControlMagic);
  w.u32(type);
  w.u64(length);
}

}  // namespace

ControlChannel::ControlChannel(int fd, int peer) : fd_(fd), peer_(peer) {}

ControlChannel::~ControlChannel() {
  if (fd_ >= 0) ::close(fd_);
}

Status ControlChannel::send(uint32_t type, const std::string& payload, double timeout_seconds) {
  if (payload.size() > kMaxControlBytes) {
    return common::internalError("control message of " + std::to_string(payload.size()) +
                                 " bytes exceeds the limit of " +
                                 std::to_string(kMaxControlBytes));
  }
  if (link_ != nullptr) {  // Note [Control over shm] C: never waits
    const bool backlog = hasBacklog();
    writeHeader(&outbox_, type, payload.size());
    outbox_ += payload;
    if (!backlog) flush();
    return Status::ok();
  }
  const tcp::Deadline deadline = tcp::deadlineAfter(timeout_seconds);
  std::string frame;
  Status s;
  if (payload.size() <= kCoalesceBytes) {
    // One send, one segment: the receiver wakes once per frame, not for a lone header.
    frame.reserve(kHeaderBytes + payload.size());
    writeHeader(&frame, type, payload.size());
    frame += payload;
    s = tcp::writeFull(fd_, frame.data(), frame.size(), deadline);
  } else {
    writeHeader(&frame, type, payload.size());
    s = tcp::writeFull(fd_, frame.data(), frame.size(), deadline);
    if (s.isOk()) s = tcp::writeFull(fd_, payload.data(), payload.size(), deadline);
  }
  return s.isOk() ? s : sendFailed(s, timeout_seconds);
}

Status ControlChannel::sendFailed(const Status& s, double timeout_seconds) const {
  // A partial frame leaves the stream unusable: the caller must drop the channel.
  if (s.code() == common::Code::kTimeout) {
    common::Text os;
    os << "timed out after " << timeout_seconds << " s sending a control message to rank "
       << peer_;
    return common::timedOut(os.str());
  }
  return common::peerLost("lost the control connection to rank " + std::to_string(peer_) + ": " +
                          s.message());
}

void ControlChannel::attachSharedMemory(std::unique_ptr<shm::RingStream> link) {
  link_ = std::move(link);
}

bool ControlChannel::flush() {
  if (!hasBacklog()) return false;
  const size_t moved =
      link_->write(reinterpret_cast<const uint8_t*>(outbox_.data()) + outbox_sent_,
                   outbox_.size() - outbox_sent_);
  outbox_sent_ += moved;
  if (outbox_sent_ == outbox_.size()) {
    outbox_sent_ = 0;
    outbox_.clear();
    if (outbox_.capacity() > kCoalesceBytes) std::string().swap(outbox_);
  }
  return moved > 0;
}

void ControlChannel::flushFor(double timeout_seconds) {
  const tcp::Deadline deadline = tcp::deadlineAfter(timeout_seconds);
  for (flush(); hasBacklog() && tcp::Clock::now() < deadline; flush()) {
    pollfd fd{fd_, POLLRDHUP, 0};
    if (::poll(&fd, 1, 0) > 0) return;  // the peer is gone (or going): nobody will read
    const timespec nap{0, 50 * 1000};
    ::nanosleep(&nap, nullptr);
  }
}

size_t ControlChannel::drainLink(size_t budget) {
  size_t total = 0;
  while (total < budget) {
    if (inbox_.size() < inbox_used_ + kReadChunk) inbox_.resize(inbox_used_ + kReadChunk);
    const size_t got = link_->read(reinterpret_cast<uint8_t*>(inbox_.data()) + inbox_used_,
                                   kReadChunk);
    inbox_used_ += got;
    total += got;
    if (got < kReadChunk) break;
  }
  return total;
}

Status ControlChannel::drainSocket() {
  if (!socket_readable_) return Status::ok();
  socket_readable_ = false;
  const int end = shm::drainWakeBytes(fd_);
  if (end == 0) return Status::ok();
  return common::peerLost("lost the control connection to rank " + std::to_string(peer_) +
                          (end == shm::kWakeSocketClosed ? std::string(": connection closed")
                                                         : ": " + tcp::errnoText(end)));
}

void ControlChannel::waitReadable(int timeout_ms) {
  pollfd fd{fd_, POLLIN, 0};
  if (link_ == nullptr) {
    ::poll(&fd, 1, timeout_ms);
    return;
  }
  // Note [Control over shm] B. Wake bytes left over from earlier sleeps make the socket
  // readable with no frame behind them: they are drained and the wait goes on, so a stale byte
  // never ends it early (a survivor would then miss the cause rank 0 relays). A hang-up ends
  // it; receive() reports it. The doorbell is the rank's, and the loop thread may have
  // announced its own poll sleep on it (this is then a caller driving the loop): the
  // announcement stays, or writers would stop waking that thread.
  shm::Doorbell* bell = link_->ownDoorbell();
  const bool loop_announced =
      bell->sleeping.load(std::memory_order_seq_cst) == shm::kPollSleep;
  shm::beginPollSleep(bell);
  const tcp::Deadline deadline = tcp::deadlineAfter(timeout_ms / 1000.0);
  while (!link_->hasData()) {
    const int left_ms = tcp::millisecondsLeft(deadline, timeout_ms);
    if (left_ms <= 0 || ::poll(&fd, 1, left_ms) <= 0) break;
    socket_readable_ = true;
    if (!drainSocket().isOk()) {
      socket_readable_ = true;  // EOF stays readable: receive() sees it again and reports it
      break;
    }
  }
  if (!loop_announced) shm::endSleep(bell);
}

Status ControlChannel::receive(std::vector<ControlMessage>* out) {
  Status end = Status::ok();
  if (link_ != nullptr) {  // Note [Control over shm] A, D
    drainLink(kReadBudget);
    if (pauseBeforeSocketForTest()) socket_readable_ = true;
    end = drainSocket();
    // The peer wrote its last frames (a failure's cause) before it hung up, maybe after the
    // drain above: read the ring again (it holds at most a ring's worth; the budget also bounds
    // a peer that lies in its counter), or that cause would be lost behind the hang-up.
    if (!end.isOk()) drainLink(kReadBudget);
  }
  for (size_t budget = link_ != nullptr ? 0 : kReadBudget; budget > 0;) {
    if (inbox_.size() < inbox_used_ + kReadChunk) inbox_.resize(inbox_used_ + kReadChunk);
    const ssize_t got = ::recv(fd_, inbox_.data() + inbox_used_, kReadChunk, MSG_DONTWAIT);
    const int err = errno;
    if (got > 0) inbox_used_ += static_cast<size_t>(got);
    if (got > 0) {
      budget -= std::min(budget, static_cast<size_t>(got));
      // A short read drained the socket: skip the recv that would only say EAGAIN (one
      // syscall per message). Later bytes, or the peer's hang-up, make poll() report it again.
      if (static_cast<size_t>(got) < kReadChunk) break;
      continue;
    }
    if (got < 0 && err == EINTR) continue;
    if (got < 0 && (err == EAGAIN || err == EWOULDBLOCK)) break;
    end = common::peerLost("lost the control connection to rank " + std::to_string(peer_) +
                           (got == 0 ? std::string(": connection closed")
                                     : ": " + tcp::errnoText(err)));
    break;
  }
  // Every whole frame in the inbox; the remaining() checks keep a partial frame's reads from
  // recording a failure: its rest arrives later.
  common::ByteReader in(inbox_.data(), inbox_used_);
  size_t offset = 0;
  uint32_t magic = 0, type = 0;
  uint64_t length = 0;
  while (in.remaining() >= kHeaderBytes && in.u32(&magic) && in.u32(&type) && in.u64(&length)) {
    if (magic != kControlMagic || length > kMaxControlBytes) {
      inbox_used_ = 0;
      return common::internalError(
          "malformed control frame from rank " + std::to_string(peer_) +
          (magic != kControlMagic ? std::string(": bad magic")
                                  : ": length " + std::to_string(length) + " over the limit"));
    }
    std::string_view payload;
    if (in.remaining() < length || !in.rawView(&payload, length)) break;
    out->push_back(ControlMessage{type, std::string(payload)});
    offset = in.position();
  }
  if (offset > 0) {
    std::memmove(inbox_.data(), inbox_.data() + offset, inbox_used_ - offset);
    inbox_used_ -= offset;
  }
  // A large frame grew the buffer: give the memory back once it has been parsed.
  if (inbox_used_ == 0 && inbox_.size() > 16 * kReadChunk) std::vector<char>().swap(inbox_);
  return end;
}

}  // namespace hvd::transport
