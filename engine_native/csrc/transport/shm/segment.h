// Segment: one rank's POSIX shared-memory segment — a doorbell (futex word + sleeping flag)
// and one single-producer/single-consumer byte ring per peer on the host that sends to this
// rank, plus, for the control channel and the point-to-point channel (both through
// transport/shm/ring_stream.h), a doorbell and a ring per peer each. Created by the owner and mapped by its peers during Mesh::connect (shm/setup.h);
// afterwards rings and doorbells are touched only by the background threads of the two ranks
// of a pair, plus Mesh::abort (any thread), which only rings the owner's doorbell.
// See Note [Doorbell ordering] in segment.cc.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "transport/shm/shared_mapping.h"

namespace hvd::transport::shm {

struct Doorbell {
  std::atomic<uint32_t> sequence;  // futex word: bumped by every futex wake
  std::atomic<uint32_t> sleeping;  // kAwake, kFutexSleep or kPollSleep
  // Point-to-point doorbell only (Note [Point-to-point over shm] C, D in
  // transport/peer_channel.cc), bits: kCallerDrives while a caller drives the owner's loop (it
  // reads the rings itself: a writer wakes nobody); kCallerSleeps while a caller sleeps in
  // FUTEX_WAIT on `sequence` to read them itself (a writer wakes it, not the loop thread).
  std::atomic<uint32_t> driving;
  // Receives the owner has open (point-to-point doorbell only): a message that fits its ring
  // wakes a sleeping owner only while there is one (Note [Point-to-point over shm] B).
  std::atomic<uint32_t> listening;
};

// Control rings carry negotiation frames, written in pieces when larger: small is enough.
constexpr uint64_t kControlRingBytes = 64 << 10;
// Point-to-point rings carry whole messages, a large one in pieces: 1 MiB per directed pair
// (benchmarks/RESULTS.md, "Point-to-point send/recv"), committed at setup like the rest of
// the segment (posix_fallocate): 1 MiB of /dev/shm per local peer and rank, 56 MiB a host
// of 8 ranks.
constexpr uint64_t kPeerRingBytes = 1 << 20;

constexpr uint32_t kAwake = 0;
constexpr uint32_t kFutexSleep = 1;  // owner is (about to be) in FUTEX_WAIT on `sequence`
constexpr uint32_t kPollSleep = 2;   // owner is (about to be) in poll() on the pair sockets
constexpr uint32_t kCallerDrives = 1;  // Doorbell::driving bits
constexpr uint32_t kCallerSleeps = 2;

struct RingHeader {
  alignas(64) std::atomic<uint64_t> head;  // bytes ever written (producer only)
  alignas(64) std::atomic<uint64_t> tail;  // bytes ever read (consumer only)
  // 1: the producer has bytes the ring had no room for and wants a wake once the consumer
  // reads (control rings only, Note [Control over shm] C); cleared by the consumer.
  std::atomic<uint32_t> writer_waiting;
};

static_assert(std::atomic<uint32_t>::is_always_lock_free, "futex word must be lock-free");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "ring counters must be lock-free");
static_assert(sizeof(std::atomic<uint32_t>) == 4, "futex word must be 32 bits");

// A view of one ring; cheap to copy. write/read move what fits now and return the count.
class Ring {
 public:
  Ring() = default;
  Ring(RingHeader* header, uint8_t* data, uint64_t capacity)
      : header_(header), data_(data), capacity_(capacity) {}

  size_t write(const uint8_t* src, size_t n);
  size_t read(uint8_t* dst, size_t n);
  bool hasSpace() const;  // seq_cst loads, for the doorbell re-check
  bool hasData() const;
  void markWriterWaiting();   // producer, seq_cst (Note [Control over shm] C)
  bool takeWriterWaiting();   // consumer, after a read: was the mark set? clears it

 private:
  RingHeader* header_ = nullptr;
  uint8_t* data_ = nullptr;
  uint64_t capacity_ = 0;
};

// The rings and doorbells between this rank and one peer of its host, and the socket that
// carries wake bytes (owned elsewhere): ShmPair's data rings, RingStream's control rings.
struct RingLink {
  Ring outgoing;             // this rank's ring in the peer's segment
  Ring incoming;             // the peer's ring in this rank's segment
  Doorbell* peer_doorbell;
  Doorbell* own_doorbell;
  int socket_fd;

  // Wakes the peer if it sleeps: data for it after a write, room for it after a read.
  void wakePeer() const;
};

// Sets or clears a bit of Doorbell::driving (kCallerDrives, kCallerSleeps), seq_cst.
void markDriving(Doorbell* doorbell, uint32_t bit, bool on);
// Wakes the doorbell's owner if it sleeps (or is about to): FUTEX_WAKE, or for a poll sleep
// one byte on `socket_fd`, the pair's TCP socket to the owner.
void wakeIfSleeping(Doorbell* doorbell, int socket_fd);
// Always bumps the sequence and FUTEX_WAKEs (abort).
void wakeAlways(Doorbell* doorbell);
// Wakes the doorbell owner's loop thread if it sleeps (poll or futex), whether or not a caller
// sleeps on the same doorbell; nobody while a caller drives (it runs whole passes). For news
// that only a pass reads (the one-round board, runtime/one_round.cc).
void wakeLoop(Doorbell* doorbell, int socket_fd);

// The owner's futex wait: announce sleep, re-check `ready` (which must read ring state with
// seq_cst loads), then FUTEX_WAIT for at most timeout_us. Returns when woken, on timeout, or at
// once if `ready` holds.
template <typename Ready>
void waitDoorbell(Doorbell* doorbell, const Ready& ready, int64_t timeout_us);
void futexWait(std::atomic<uint32_t>* word, uint32_t expected, int64_t timeout_us);

// The owner's poll wait, for when sockets must be watched too: beginPollSleep, re-check
// `ready`, poll() the pair sockets with POLLIN among the others, endSleep, then
// drainWakeBytes on every pair socket that polled readable.
void beginPollSleep(Doorbell* doorbell);
void endSleep(Doorbell* doorbell);
// Reads every wake byte queued on the socket: 0 while it stays open, kWakeSocketClosed when
// the peer hung up, else the errno of a socket error (a hang-up too).
constexpr int kWakeSocketClosed = -1;
int drainWakeBytes(int socket_fd);

class Segment {
 public:
  Segment(const Segment&) = delete;
  Segment& operator=(const Segment&) = delete;

  // Creates and maps a new segment (SharedMapping::create) with `ring_count` rings of
  // `ring_bytes` each.
  static common::Status create(const std::string& name, uint32_t ring_count, uint64_t ring_bytes,
                               std::unique_ptr<Segment>* out);
  // Maps a peer's segment and validates its header against what the peer announced.
  static common::Status open(const std::string& name, uint32_t ring_count, uint64_t ring_bytes,
                             std::unique_ptr<Segment>* out);

  void unlink() { mapping_.unlink(); }  // removes the name (the mapping stays); idempotent
  const std::string& name() const { return mapping_.name(); }
  uint32_t ringCount() const { return ring_count_; }
  uint64_t ringBytes() const { return ring_bytes_; }
  Doorbell* doorbell() const;
  Ring ring(uint32_t index) const;
  Doorbell* controlDoorbell() const;  // its owner's loop thread announces poll sleeps here
  Ring controlRing(uint32_t index) const;  // from the same peer as ring(index)
  Doorbell* peerDoorbell() const;     // the same, for point-to-point
  Ring peerRing(uint32_t index) const;    // from the same peer as ring(index)

  static uint64_t totalBytes(uint32_t ring_count, uint64_t ring_bytes);

 private:
  Segment() = default;
  uint8_t* base() const { return mapping_.base(); }

  SharedMapping mapping_;
  uint32_t ring_count_ = 0;  // private copies: never re-read from the shared header
  uint64_t ring_bytes_ = 0;
};

template <typename Ready>
void waitDoorbell(Doorbell* doorbell, const Ready& ready, int64_t timeout_us) {
  const uint32_t seen = doorbell->sequence.load(std::memory_order_seq_cst);
  doorbell->sleeping.store(kFutexSleep, std::memory_order_seq_cst);
  if (!ready()) futexWait(&doorbell->sequence, seen, timeout_us);
  endSleep(doorbell);
}

}  // namespace hvd::transport::shm
