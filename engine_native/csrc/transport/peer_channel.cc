// Point-to-point connections (transport/peer_channel.h).
//
// Reads go into a 64 KiB inbox and are parsed from there, so a small message costs one recv()
// however many parts it has; the rest of a payload larger than the inbox is read straight into
// its own memory. Writes gather up to kMaxFramesPerWrite queued frames (header and payload
// each) into one sendmsg().
//
// A header announces its payload's length before any of it arrives; the payload's memory comes
// from the channel's allocator (reservedPeerPayload unless the runtime set its own).
//
// Note [Point-to-point over shm]
// Over loopback TCP a message cost a copy into the kernel and one out, ~10 us of kernel path
// each way for a small one, and a large one moved at 1.6-2 GB/s (MPICH, through shared
// memory: 2.5 us and 7.6 GB/s). Between ranks of one host the same frames (header, payload)
// now go through a ring of kPeerRingBytes in the receiver's segment (Segment::peerRing),
// written and read with the RingStream rules of Note [Control over shm]:
//   A. A pass reads the ring whenever it has bytes (a load when empty, no system call), so a
//      message no receive waits for still moves out of the ring and sends never wait for a
//      receive (Note [Point-to-point] B).
//   B. The loop thread announces kPollSleep on its segment's peer doorbell before its poll()
//      and re-checks: a byte in an incoming ring, or room in the ring of a channel with a
//      backlog (rearmWriter), ends the sleep before it starts. A writer that sees the sleep
//      after its write sends one wake byte on this channel's socket, which the loop polls —
//      if the owner listens (the doorbell's `listening`: receives open, counted by PeerOps
//      from their submission to their end) or the write did not fit (the owner must make
//      room: A). A message nobody waits for yet stays in the ring until the receive that
//      takes it is submitted, whose pass reads the rings (or, when it cannot drive, whose
//      submission wakes the loop); any pass reads it sooner. Waking for it cost the sender a
//      system call and, on a host whose cores the ranks fill, the core itself: the woken loop
//      thread ran on the sender's core (a pipeline's hand-off-bound step: 10-11 loop wake-ups
//      per rank for 16 messages, isend calls of 40-50 us where 11 us without).
//   C. A caller driving the loop (Note [Caller drives]) sets kCallerDrives in the doorbell's
//      `driving`: it reads the rings every pass, so writers skip the wake byte (a system call,
//      and a wake of a loop thread that would only wait for the caller's lock). It clears `driving` and then
//      checks the rings (PeerOps::idle) before it lets the loop thread sleep on: a write it
//      missed is either seen there or sees `driving` clear and wakes the loop (the Dekker pair
//      of Note [Doorbell ordering]).
//   D. The socket carries no frames. It is read when poll() says so: wake bytes are drained,
//      and its hang-up (a dead or closed peer) is the channel's loss, after one more read of
//      the ring so that what the peer wrote before it went is delivered first.
//   E. A ring is written and read kRingPieceBytes at a time, each piece published at once,
//      so the reader copies one piece out while the writer copies the next in, and the pieces
//      stay in the cache between the two copies. Whole-ring writes and reads (1 MiB) left the
//      two sides taking turns: 64 MiB at 5 GB/s; 64 KiB pieces: 10-11 GB/s, as MPICH
//      (benchmarks/RESULTS.md, "Point-to-point send/recv", has the pieces tried).
//   F. One receive() reads at most a ring's worth, then the pass moves on: a writer that
//      keeps the ring full, or a peer that lies in its counter, cannot hold the loop in one
//      channel (the lie was found by the fuzz tier, target peer_frames_shm). Ring reads also
//      never trust the peer's counters past the ring's size (Ring::read/write).
//   G. A caller blocked on a point-to-point op may sleep on the doorbell itself (Note [Caller
//      sleeps on the doorbell] in runtime/peer_await.cc): it sets kCallerSleeps, and a writer
//      that sees it FUTEX_WAKEs the doorbell's sequence instead of sending the wake byte, so
//      the caller, not the loop thread, is woken and reads the rings (one wake-up on the
//      critical path, not two). Whether a write wakes at all is still B's rule.
#include "transport/peer_channel.h"

#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "common/byte_codec.h"
#include "common/test_switch.h"
#include "transport/tcp/socket.h"

namespace hvd::transport {

using common::Status;

namespace {

constexpr size_t kInboxBytes = 64 << 10;
constexpr size_t kMaxFramesPerWrite = 32;
constexpr size_t kRingPieceBytes = 64 << 10;  // Note [Point-to-point over shm] E

Status lost(int peer, const std::string& what) {
  return common::peerLost("point-to-point connection to rank " + std::to_string(peer) + " " +
                          what);
}

constexpr uint64_t kMappedPayloadBytes = 1 << 20;

size_t allocationBytes(uint64_t bytes) {
  return static_cast<size_t>((std::max<uint64_t>(bytes, 1) + 63) / 64 * 64);
}

}  // namespace

uint8_t* reservePayloadMapping(uint64_t bytes) {
  void* p = ::mmap(nullptr, allocationBytes(bytes), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

void releasePayloadMapping(uint8_t* data, uint64_t bytes) {
  if (data != nullptr) ::munmap(data, allocationBytes(bytes));
}

PeerPayload reservedPeerPayload(uint64_t bytes) {
  if (bytes < kMappedPayloadBytes) {
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, allocationBytes(bytes)));
    if (p == nullptr) return {};
    return {std::shared_ptr<void>(p, [](void* q) { std::free(q); }), p};
  }
  uint8_t* p = reservePayloadMapping(bytes);
  if (p == nullptr) return {};
  return {std::shared_ptr<void>(p, [bytes](void* q) {
            releasePayloadMapping(static_cast<uint8_t*>(q), bytes);
          }),
          p};
}

// Test switch: HVD_TEST_PEER_PAUSE_AT_BYTES=N with HVD_TEST_PEER_PAUSE_FILE=path: a channel on
// shared memory writes no byte past its N-th while that file exists: a sender stuck in the
// middle of a message, which goes on when the test removes the file (the writer retries on
// its loop's tick, as after a full ring).
PeerChannel::PeerChannel(int fd, int peer) : fd_(fd), peer_(peer), inbox_(kInboxBytes) {
  const char* at = HVD_TEST_SWITCH("PEER_PAUSE_AT_BYTES");
  pause_file_ = HVD_TEST_SWITCH("PEER_PAUSE_FILE");
  if (at != nullptr && pause_file_ != nullptr) pause_at_ = std::strtoull(at, nullptr, 10);
}

PeerChannel::~PeerChannel() {
  settleHelperRead();  // Note [Split copy] G
  // Note [Split copy] F: a sender that has not said Done may still write into this memory.
  if (split_in_.active && !split_in_.sender_done) keepForever(split_in_.message.payload.owner);
  tcp::closeFd(&fd_);
}

void PeerChannel::send(const PeerFrame& frame, const void* payload, uint64_t id) {
  Outgoing o;
  o.header = encodePeerHeader(frame);
  o.payload = static_cast<const uint8_t*>(payload);
  o.bytes = frame.bytes;
  o.id = id;
  // Note [One round] K: a board frame is waited for by a loop that has no receive open
  o.wakes = frame.kind == PeerFrameKind::kBoardPost || frame.kind == PeerFrameKind::kBoardState;
  outbox_.push_back(std::move(o));
  if (splitEligible(frame)) {  // Note [Split copy]
    Outgoing& o = outbox_.back();
    o.frame = frame;
    o.tensor = o.payload;
    offer(&o);
  }
}

Status PeerChannel::flush(std::vector<uint64_t>* sent, bool* moved) {
  HVD_RETURN_IF_ERROR(writeControl(moved));
  while (!outbox_.empty()) {
    Outgoing& head = outbox_.front();
    if (head.split >= Split::kAwaitAccept) {  // Note [Split copy]: its offer is written
      if (head.split == Split::kWriting) HVD_RETURN_IF_ERROR(writeHalf(&head, moved));
      HVD_RETURN_IF_ERROR(writeControl(moved));
      if (head.split != Split::kDone) return Status::ok();  // the peer answers, or next pass
      sent->push_back(head.id);
      outbox_.pop_front();
      continue;
    }
    // Answers go first between frames (Note [Split copy] C): one still queued there found the
    // ring full. A frame half written goes on first (the answer waits for its end).
    if (!control_.empty() && head.written == 0) return Status::ok();
    const size_t before = outbox_.size();
    const uint64_t head_written = head.written;
    HVD_RETURN_IF_ERROR(writeFrames(sent, moved));
    if (outbox_.size() == before && !outbox_.empty() &&
        outbox_.front().written == head_written) {
      return Status::ok();  // nothing went: the socket or ring is full
    }
  }
  return Status::ok();
}

// One gathered write of the queued frames, up to the first split offer (Note [Split copy]: no
// frame may pass a split message).
Status PeerChannel::writeFrames(std::vector<uint64_t>* sent, bool* moved) {
  while (true) {
    iovec iov[2 * kMaxFramesPerWrite];
    int count = 0;
    bool offer = false;  // Note [Split copy] C: an offer needs an answer, so it always wakes (so
                         // does a board frame: Outgoing::wakes)
    for (size_t k = 0; k < outbox_.size() && k < kMaxFramesPerWrite; ++k) {
      const Outgoing& o = outbox_[k];
      offer = offer || o.split == Split::kOffer || o.wakes;
      const uint64_t header = o.header.size();
      if (o.written < header) {
        iov[count++] = {const_cast<char*>(o.header.data()) + o.written, header - o.written};
      }
      const uint64_t from = o.written > header ? o.written - header : 0;
      if (from < o.bytes) iov[count++] = {const_cast<uint8_t*>(o.payload) + from, o.bytes - from};
      if (o.split != Split::kNone) break;
    }
    const ssize_t n = count > 0 ? writeSome(iov, count, offer) : 0;
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
      return lost(peer_, std::string("failed: ") + std::strerror(errno));
    }
    if (n == 0) return Status::ok();  // a full ring: its reader wakes us (B)
    *moved = true;
    uint64_t left = static_cast<uint64_t>(n);
    while (!outbox_.empty()) {
      Outgoing& o = outbox_.front();
      const uint64_t total = o.header.size() + o.bytes;
      const uint64_t take = std::min(left, total - o.written);
      o.written += take;
      left -= take;
      if (o.written < total) break;
      if (o.split == Split::kOffer) {  // written: it waits for the peer's answer
        o.split = Split::kAwaitAccept;
        break;
      }
      sent->push_back(o.id);
      outbox_.pop_front();
    }
    return Status::ok();
  }
}

Status PeerChannel::receive(std::vector<PeerMessage>* out, bool* moved, bool socket_readable) {
  HVD_RETURN_IF_ERROR(broken_);
  if (splitReadPending()) HVD_RETURN_IF_ERROR(readHalf(moved));  // Note [Split copy]
  const Status status = receiveRing(out, moved, socket_readable);
  // its half read, and the sender's written (or the helper's read: G)
  HVD_RETURN_IF_ERROR(completeSplit(out));
  HVD_RETURN_IF_ERROR(writeControl(moved));  // answers go at once, not on the next pass
  return status;
}

Status PeerChannel::receiveRing(std::vector<PeerMessage>* out, bool* moved,
                                bool socket_readable) {
  bool closed = false;  // shared memory: the socket hung up; deliver what the ring holds first
  if (link_ != nullptr && socket_readable) closed = shm::drainWakeBytes(fd_) != 0;  // D
  // A ring is read at most a ring's worth per call (F): a writer that keeps it full, or lies
  // in its counter, cannot hold the pass here.
  uint64_t budget = link_ != nullptr ? shm::kPeerRingBytes : UINT64_MAX;
  while (true) {
    HVD_RETURN_IF_ERROR(parse(out));
    uint8_t* dst;
    size_t room;
    const uint64_t payload_left = incoming_.frame.bytes - payload_got_;
    if (stage_ == Stage::kPayload && payload_left >= kInboxBytes) {
      dst = incoming_.payload.data + payload_got_;  // large: straight into the message
      room = static_cast<size_t>(payload_left);
    } else {
      if (inbox_begin_ == inbox_end_) inbox_begin_ = inbox_end_ = 0;
      if (inbox_end_ == inbox_.size() && inbox_begin_ > 0) {
        std::memmove(inbox_.data(), inbox_.data() + inbox_begin_, inbox_end_ - inbox_begin_);
        inbox_end_ -= inbox_begin_;
        inbox_begin_ = 0;
      }
      dst = inbox_.data() + inbox_end_;
      room = inbox_.size() - inbox_end_;
    }
    const ssize_t n = readSome(dst, room);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
      return lost(peer_, std::string("failed: ") + std::strerror(errno));
    }
    if (n == 0 && link_ != nullptr) {  // the ring is empty (D)
      return closed ? lost(peer_, "was closed by the peer") : Status::ok();
    }
    if (n == 0) return lost(peer_, "was closed by the peer");
    *moved = true;
    budget -= std::min<uint64_t>(budget, static_cast<uint64_t>(n));
    const bool into_inbox = dst == inbox_.data() + inbox_end_;
    if (into_inbox) {
      inbox_end_ += static_cast<size_t>(n);
    } else {
      payload_got_ += static_cast<uint64_t>(n);
    }
    if (budget == 0) return parse(out);  // F: the next pass goes on
    // A short read of a socket into the inbox most likely drained it: skip the recv that would
    // only say EAGAIN, as ControlChannel does. Whatever is left, later bytes or the peer's
    // hang-up, make the socket poll readable again (or a later pass reads it: Note [Caller
    // drives] D). That recv took the socket's lock while the peer's next frame was being
    // delivered, a system call more per small message (RESULTS.md, "Small ops across hosts").
    if (link_ == nullptr && into_inbox && static_cast<size_t>(n) < room) return parse(out);
  }
}

ssize_t PeerChannel::writeSome(const iovec* iov, int count, bool always_wake) {
  if (link_ != nullptr) {  // E: a piece at a time
    iovec capped[2 * kMaxFramesPerWrite];
    size_t budget = kRingPieceBytes;
    if (paused()) return 0;
    if (pause_at_ != 0) budget = std::min<uint64_t>(budget, pause_at_ - written_);
    int k = 0;
    for (; k < count && budget > 0; ++k) {
      capped[k] = iov[k];
      capped[k].iov_len = std::min(capped[k].iov_len, budget);
      budget -= capped[k].iov_len;
    }
    const size_t wrote = link_->writeGather(capped, k, always_wake);
    written_ += wrote;
    return static_cast<ssize_t>(wrote);
  }
  msghdr message{};
  message.msg_iov = const_cast<iovec*>(iov);
  message.msg_iovlen = static_cast<size_t>(count);
  // MSG_NOSIGNAL: a closed peer is an EPIPE here, never a SIGPIPE for the process
  return ::sendmsg(fd_, &message, MSG_NOSIGNAL | MSG_DONTWAIT);
}

bool PeerChannel::paused() {
  if (pause_at_ == 0 || written_ < pause_at_) return false;
  if (::access(pause_file_, F_OK) == 0) return true;  // the loop sleeps to its tick meanwhile
  pause_at_ = 0;
  return false;
}

ssize_t PeerChannel::readSome(uint8_t* dst, size_t room) {
  if (link_ != nullptr) return static_cast<ssize_t>(link_->read(dst, std::min(room, kRingPieceBytes)));
  return ::recv(fd_, dst, room, MSG_DONTWAIT);
}

// Takes what the inbox holds: a length, a header, payload bytes; completes messages.
Status PeerChannel::parse(std::vector<PeerMessage>* out) {
  while (true) {
    const size_t have = inbox_end_ - inbox_begin_;
    const uint8_t* at = inbox_.data() + inbox_begin_;
    if (stage_ == Stage::kLength) {
      if (have < 4) break;
      common::ByteReader in(at, 4);
      in.u32(&header_bytes_);
      if (header_bytes_ == 0 || header_bytes_ > kMaxPeerHeaderBytes) {
        return common::internalError("malformed point-to-point frame from rank " +
                                     std::to_string(peer_) + ": header of " +
                                     std::to_string(header_bytes_) + " bytes");
      }
      inbox_begin_ += 4;
      stage_ = Stage::kHeader;
    } else if (stage_ == Stage::kHeader) {
      if (have < header_bytes_) break;
      Status s = decodePeerHeader(at, header_bytes_, &incoming_.frame);
      if (!s.isOk()) {
        return Status(s.code(), s.message() + " (from rank " + std::to_string(peer_) + ")");
      }
      inbox_begin_ += header_bytes_;
      if (incoming_.frame.kind >= PeerFrameKind::kSplitOffer &&
          incoming_.frame.kind <= PeerFrameKind::kSplitReadAll) {
        stage_ = Stage::kControl;  // Note [Split copy]: a small payload, taken from the inbox
      } else {
        HVD_RETURN_IF_ERROR(startPayload());
      }
    } else if (stage_ == Stage::kControl) {
      const auto bytes = static_cast<size_t>(incoming_.frame.bytes);  // <= 32 (decoded)
      if (have < bytes) break;
      inbox_begin_ += bytes;
      stage_ = Stage::kLength;
      const PeerFrame frame = std::move(incoming_.frame);
      incoming_ = PeerMessage();
      HVD_RETURN_IF_ERROR(handleControl(frame, at));
    } else {
      const uint64_t left = incoming_.frame.bytes - payload_got_;
      const size_t take = static_cast<size_t>(std::min<uint64_t>(left, have));
      if (take == 0 && left > 0) break;
      std::memcpy(incoming_.payload.data + payload_got_, at, take);
      inbox_begin_ += take;
      payload_got_ += take;
      if (payload_got_ == incoming_.frame.bytes) {
        out->push_back(std::move(incoming_));
        incoming_ = PeerMessage();
        stage_ = Stage::kLength;
      }
    }
  }
  return Status::ok();
}

Status PeerChannel::startPayload() {
  if (whole_.data != nullptr) {  // Note [Split copy] F: the memory its offer was given
    const PeerFrame& offered = whole_frame_;
    if (incoming_.frame.kind != PeerFrameKind::kHost || incoming_.frame.tag != offered.tag ||
        incoming_.frame.dtype != offered.dtype || incoming_.frame.shape != offered.shape) {
      return common::internalError("malformed split copy from rank " + std::to_string(peer_) +
                                   ": the message sent whole is not the one offered");
    }
    incoming_.payload = std::move(whole_);
    whole_ = PeerPayload();
  } else {
    incoming_.payload = allocate_(allocate_context_, peer_, incoming_.frame);
  }
  if (incoming_.payload.data == nullptr) {
    return outOfMemory(incoming_.frame.bytes, "a");
  }
  payload_got_ = 0;
  stage_ = Stage::kPayload;
  return Status::ok();
}

Status PeerChannel::outOfMemory(uint64_t bytes, const char* what) const {
  return common::internalError(std::string("out of memory for ") + what +
                               " point-to-point message of " + std::to_string(bytes) +
                               " bytes from rank " + std::to_string(peer_));
}

void PeerChannel::rehomeIncoming(const uint8_t* data) {
  if (whole_.data != nullptr && whole_.data == data) {  // nothing written there yet
    whole_ = allocate_(allocate_context_, peer_, whole_frame_);
    if (whole_.data == nullptr) {
      broken_ = outOfMemory(whole_frame_.bytes, "a");
    }
    return;
  }
  if (rehomeReadAll(data)) return;  // Note [Split copy] G
  if (stage_ != Stage::kPayload || incoming_.payload.data != data) return;
  PeerPayload fresh = allocate_(allocate_context_, peer_, incoming_.frame);
  if (fresh.data == nullptr) {
    broken_ = outOfMemory(incoming_.frame.bytes, "the rest of a");
    incoming_ = PeerMessage();  // never written again
    return;
  }
  std::memcpy(fresh.data, incoming_.payload.data, static_cast<size_t>(payload_got_));
  incoming_.payload = std::move(fresh);
}

}  // namespace hvd::transport
