// Shared-memory segment, rings and doorbell (transport/shm/segment.h).
//
// Layout: [header 64 B][doorbell 64 B][control doorbell 64 B][peer doorbell 64 B]
// [ring 0: RingHeader 128 B, data][ring 1 ...][control ring 0: RingHeader 128 B,
// kControlRingBytes][control ring 1 ...][peer ring 0: RingHeader 128 B, kPeerRingBytes]
// [peer ring 1 ...], every ring starting on a 64-byte boundary so producer and consumer
// counters never share a cache line. Data, control and peer ring k receive from the same peer.
//
// Note [Doorbell ordering]
// The owner of a doorbell sleeps only if no peer can have made progress possible for it:
//   owner (waitDoorbell)                        peer (after ring write/read, wakeIfSleeping)
//   O1 seen = sequence            (seq_cst)     P1 head/tail = new value      (seq_cst store)
//   O2 sleeping = 1               (seq_cst)     P2 if sleeping == 1           (seq_cst load)
//   O3 ready(): load head/tail    (seq_cst)     P3    sequence += 1           (seq_cst)
//   O4 FUTEX_WAIT(sequence, seen)               P4    FUTEX_WAKE(sequence)
// All of O2, O3, P1, P2 are seq_cst, so they fall in one total order: either P1 precedes O3 (the
// owner sees the new data/space and does not sleep) or O2 precedes P2 (the peer sees sleeping
// and wakes). In the second case, if P3 lands before O4 the kernel finds sequence != seen and
// FUTEX_WAIT returns at once; if after, O4 is already queued and P4 wakes it. A lost wake-up is
// therefore impossible; a spurious one (sleeping is set while the owner waits for another peer)
// only costs a re-check. Release/acquire alone would not do: O2->O3 and P1->P2 are store->load
// pairs, which only a full (seq_cst) order keeps from being reordered. Payload bytes are
// published by the seq_cst store of head (a release) and read after the seq_cst load of head
// (an acquire); space is handed back the same way through tail. The futex word is shared
// between processes, so FUTEX_WAIT/FUTEX_WAKE are used without FUTEX_PRIVATE_FLAG.
// A poll sleep (the owner also waits for TCP sockets, which a futex cannot watch) is the same
// protocol with O2 storing kPollSleep, O4 a poll() that includes the pair sockets, and P3-P4
// one byte sent on the pair socket instead of the futex wake: the byte stays readable until
// drained, so a wake sent before the poll starts is not lost either.
#include "transport/shm/segment.h"

#include <linux/futex.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <ctime>

namespace hvd::transport::shm {

using common::Status;

namespace {

constexpr uint64_t kSegmentMagic = 0x33304d4853445648ull;  // "HVDSHM03"
constexpr size_t kHeaderBytes = 64;
constexpr size_t kDoorbellOffset = 64;
constexpr size_t kControlDoorbellOffset = 128;
constexpr size_t kPeerDoorbellOffset = 192;
constexpr size_t kRingsOffset = 256;

struct SegmentHeader {
  uint64_t magic;
  uint32_t ring_count;
  uint32_t reserved;
  uint64_t ring_bytes;
  uint64_t total_bytes;
};
static_assert(sizeof(SegmentHeader) <= kHeaderBytes, "header must fit its slot");
static_assert(sizeof(Doorbell) <= 64, "doorbell must fit its slot");
static_assert(kControlRingBytes % 64 == 0, "control rings keep the 64-byte alignment");
static_assert(kPeerRingBytes % 64 == 0, "peer rings keep the 64-byte alignment");
static_assert(sizeof(RingHeader) == 128, "ring header is two cache lines");

uint64_t ringStride(uint64_t ring_bytes) {
  return sizeof(RingHeader) + ((ring_bytes + 63) / 64) * 64;
}

long futexCall(std::atomic<uint32_t>* word, int op, uint32_t value, const timespec* timeout) {
  return ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), op, value, timeout, nullptr, 0);
}

}  // namespace

size_t Ring::write(const uint8_t* src, size_t n) {
  const uint64_t head = header_->head.load(std::memory_order_relaxed);  // ours
  const uint64_t tail = header_->tail.load(std::memory_order_seq_cst);
  // tail is the peer's to write: a value ahead of head or behind it by more than the ring
  // leaves no room, rather than a count past the ring's end
  const uint64_t used = head - tail;
  const uint64_t free_bytes = used > capacity_ ? 0 : capacity_ - used;
  const size_t k = static_cast<size_t>(std::min<uint64_t>(n, free_bytes));
  if (k == 0) return 0;
  const size_t pos = static_cast<size_t>(head % capacity_);
  const size_t first = std::min<size_t>(k, static_cast<size_t>(capacity_) - pos);
  std::memcpy(data_ + pos, src, first);
  std::memcpy(data_, src + first, k - first);
  header_->head.store(head + k, std::memory_order_seq_cst);
  return k;
}

size_t Ring::read(uint8_t* dst, size_t n) {
  const uint64_t tail = header_->tail.load(std::memory_order_relaxed);  // ours
  const uint64_t head = header_->head.load(std::memory_order_seq_cst);
  // head is the peer's to write: never read more than the ring holds, whatever it says
  const size_t k = static_cast<size_t>(std::min<uint64_t>({n, head - tail, capacity_}));
  if (k == 0) return 0;
  const size_t pos = static_cast<size_t>(tail % capacity_);
  const size_t first = std::min<size_t>(k, static_cast<size_t>(capacity_) - pos);
  std::memcpy(dst, data_ + pos, first);
  std::memcpy(dst + first, data_, k - first);
  header_->tail.store(tail + k, std::memory_order_seq_cst);
  return k;
}

bool Ring::hasSpace() const {
  const uint64_t head = header_->head.load(std::memory_order_seq_cst);
  return head - header_->tail.load(std::memory_order_seq_cst) < capacity_;
}

bool Ring::hasData() const {
  const uint64_t tail = header_->tail.load(std::memory_order_seq_cst);
  return header_->head.load(std::memory_order_seq_cst) != tail;
}

void Ring::markWriterWaiting() { header_->writer_waiting.store(1, std::memory_order_seq_cst); }

bool Ring::takeWriterWaiting() {
  return header_->writer_waiting.load(std::memory_order_seq_cst) != 0 &&
         header_->writer_waiting.exchange(0, std::memory_order_seq_cst) != 0;
}

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us) {
  timespec timeout{};
  timeout.tv_sec = static_cast<time_t>(timeout_us / 1000000);
  timeout.tv_nsec = static_cast<long>((timeout_us % 1000000) * 1000);
  // EAGAIN (the word moved), EINTR and ETIMEDOUT all mean: go and re-check.
  futexCall(word, FUTEX_WAIT, expected, &timeout);
}

void markDriving(Doorbell* doorbell, uint32_t bit, bool on) {
  if (on) {
    doorbell->driving.fetch_or(bit, std::memory_order_seq_cst);
  } else {
    doorbell->driving.fetch_and(~bit, std::memory_order_seq_cst);
  }
}

namespace {

// The owner's loop thread, if it sleeps: FUTEX_WAKE, or a wake byte for a poll sleep.
void wakeSleepingLoop(Doorbell* doorbell, int socket_fd) {
  const uint32_t sleeping = doorbell->sleeping.load(std::memory_order_seq_cst);
  if (sleeping == kFutexSleep) {
    wakeAlways(doorbell);
  } else if (sleeping == kPollSleep) {
    // EAGAIN means unread wake bytes are already queued, which wakes the owner just as well.
    const uint8_t wake = 1;
    ::send(socket_fd, &wake, 1, MSG_DONTWAIT | MSG_NOSIGNAL);
  }
}

}  // namespace

void wakeIfSleeping(Doorbell* doorbell, int socket_fd) {
  const uint32_t driving = doorbell->driving.load(std::memory_order_seq_cst);
  // A caller that sleeps reads the rings once woken (the loop thread sleeps on), also while
  // another drives: that one may give up after its last read of this frame.
  if ((driving & kCallerSleeps) != 0) {
    wakeAlways(doorbell);
    return;
  }
  if ((driving & kCallerDrives) != 0) return;  // a caller reads the rings every pass
  wakeSleepingLoop(doorbell, socket_fd);
}

void wakeLoop(Doorbell* doorbell, int socket_fd) {
  if ((doorbell->driving.load(std::memory_order_seq_cst) & kCallerDrives) != 0) return;
  wakeSleepingLoop(doorbell, socket_fd);
}

void RingLink::wakePeer() const { wakeIfSleeping(peer_doorbell, socket_fd); }

void beginPollSleep(Doorbell* doorbell) {
  doorbell->sleeping.store(kPollSleep, std::memory_order_seq_cst);
}

void endSleep(Doorbell* doorbell) { doorbell->sleeping.store(kAwake, std::memory_order_seq_cst); }

int drainWakeBytes(int socket_fd) {
  uint8_t sink[256];
  while (true) {
    const ssize_t n = ::recv(socket_fd, sink, sizeof(sink), MSG_DONTWAIT);
    if (n > 0 || (n < 0 && errno == EINTR)) continue;
    if (n == 0) return kWakeSocketClosed;
    return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : errno;
  }
}

void wakeAlways(Doorbell* doorbell) {
  doorbell->sequence.fetch_add(1, std::memory_order_seq_cst);
  futexCall(&doorbell->sequence, FUTEX_WAKE, INT_MAX, nullptr);
}

uint64_t Segment::totalBytes(uint32_t ring_count, uint64_t ring_bytes) {
  return kRingsOffset + ring_count * (ringStride(ring_bytes) + ringStride(kControlRingBytes) +
                                      ringStride(kPeerRingBytes));
}

Status Segment::create(const std::string& name, uint32_t ring_count, uint64_t ring_bytes,
                       std::unique_ptr<Segment>* out) {
  const uint64_t total = totalBytes(ring_count, ring_bytes);
  std::unique_ptr<Segment> segment(new Segment());
  HVD_RETURN_IF_ERROR(SharedMapping::create(name, total, &segment->mapping_));
  segment->ring_count_ = ring_count;
  segment->ring_bytes_ = ring_bytes;
  // The file is zero-filled, which is the initial state of every atomic; only the header needs
  // writing. Peers read it after receiving the name over a socket (a syscall, so ordered).
  auto* header = reinterpret_cast<SegmentHeader*>(segment->base());
  header->magic = kSegmentMagic;
  header->ring_count = ring_count;
  header->ring_bytes = ring_bytes;
  header->total_bytes = total;
  *out = std::move(segment);
  return Status::ok();
}

Status Segment::open(const std::string& name, uint32_t ring_count, uint64_t ring_bytes,
                     std::unique_ptr<Segment>* out) {
  const uint64_t total = totalBytes(ring_count, ring_bytes);
  std::unique_ptr<Segment> segment(new Segment());
  HVD_RETURN_IF_ERROR(SharedMapping::open(name, total, &segment->mapping_));
  segment->ring_count_ = ring_count;
  segment->ring_bytes_ = ring_bytes;
  const auto* header = reinterpret_cast<const SegmentHeader*>(segment->base());
  if (header->magic != kSegmentMagic || header->ring_count != ring_count ||
      header->ring_bytes != ring_bytes || header->total_bytes != total) {
    return common::internalError("shared memory " + name + " has a bad header");
  }
  *out = std::move(segment);
  return Status::ok();
}

Doorbell* Segment::doorbell() const { return reinterpret_cast<Doorbell*>(base() + kDoorbellOffset); }

Doorbell* Segment::controlDoorbell() const {
  return reinterpret_cast<Doorbell*>(base() + kControlDoorbellOffset);
}

Ring Segment::controlRing(uint32_t index) const {
  uint8_t* start = base() + kRingsOffset + ring_count_ * ringStride(ring_bytes_) +
                   index * ringStride(kControlRingBytes);
  return Ring(reinterpret_cast<RingHeader*>(start), start + sizeof(RingHeader),
              kControlRingBytes);
}

Doorbell* Segment::peerDoorbell() const {
  return reinterpret_cast<Doorbell*>(base() + kPeerDoorbellOffset);
}

Ring Segment::peerRing(uint32_t index) const {
  uint8_t* start = base() + kRingsOffset +
                   ring_count_ * (ringStride(ring_bytes_) + ringStride(kControlRingBytes)) +
                   index * ringStride(kPeerRingBytes);
  return Ring(reinterpret_cast<RingHeader*>(start), start + sizeof(RingHeader), kPeerRingBytes);
}

Ring Segment::ring(uint32_t index) const {
  uint8_t* start = base() + kRingsOffset + index * ringStride(ring_bytes_);
  return Ring(reinterpret_cast<RingHeader*>(start), start + sizeof(RingHeader), ring_bytes_);
}

}  // namespace hvd::transport::shm
