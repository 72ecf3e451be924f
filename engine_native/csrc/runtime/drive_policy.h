// DrivePolicy: whether a framework thread about to block on its own op may run the loop's
// passes itself (Note [Caller drives] D in background_loop.cc: collectives always, over TCP
// up to 1 MiB; point-to-point only where every peer is on shm) and how long it may spin
// doing so (HVD_CALLER_SPIN_US, backed off while spins keep running out: Note [Spin backoff]
// below). configure()d once by BackgroundLoop's constructor,
// before any framework thread can drive; the backoff counters are atomics any thread updates.
// BackgroundLoop keeps two records: the collectives' and point-to-point waits' (Note [Caller
// drives] H), so that either's waits back off on their own misses alone.
//
// Note [Spin backoff]
// A spin pays only while the peers run: on a host with more runnable threads than cores, two
// ranks can share one core's run queue, and then the spinner holds the core its peer needs
// for the whole budget — every op costs the budget plus a wake-up (np=2, load 6-7: 4 B ops at
// ~255 us in about half the launches, ~15 us in the others; with no spin 55-100 us in every
// launch). So after kMissesToBackOff drives in a row that spun (ran more than one pass) until
// the budget ran out with the op unfinished, a caller does not spin (one pass, then it blocks
// and the loop thread takes over), except every kProbeEvery-th drive while backed off, which
// spins to see whether spinning pays again; a drive that spun and finished its op resets the
// count. A single pass proves nothing either way (the peers' requests were already there, or
// the caller slept on the mutex for its budget) and leaves the count alone — and leaves a
// probe due, so the next drive probes instead: where drives alternate between two kinds (a
// ping-pong's send, done in its first pass, and its receive) a probe number must not always
// fall on the kind that proves nothing (measured: a backed-off ping-pong never recovered).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>

namespace hvd::runtime {

class DrivePolicy {
 public:
  // max_bytes: the largest op (its entries' bytes together) a caller drives (Note [Caller
  // drives] D: 1 MiB over TCP)
  void configure(bool drivable, std::chrono::microseconds spin,
                 uint64_t max_bytes = ~uint64_t{0}) {
    drivable_ = drivable;
    spin_ = spin;
    max_bytes_ = max_bytes;
  }
  bool drivable() const { return drivable_; }
  bool drives(uint64_t bytes) const { return drivable_ && bytes <= max_bytes_; }
  std::chrono::microseconds configuredSpin() const { return spin_; }
  // The spin budget of the next drive: zero while backed off, except on a probe.
  std::chrono::microseconds nextSpin() {
    if (misses_.load(std::memory_order_relaxed) < kMissesToBackOff ||
        probe_due_.load(std::memory_order_relaxed)) {
      return spin_;
    }
    if (backed_off_drives_.fetch_add(1, std::memory_order_relaxed) % kProbeEvery != 0) {
      return std::chrono::microseconds(0);
    }
    probe_due_.store(true, std::memory_order_relaxed);
    return spin_;
  }
  // The budget of a wait that follows a drive (Note [Caller waits on the device] B): the
  // configured spin, zero while backed off; counts no drive.
  std::chrono::microseconds currentSpin() const {
    return misses_.load(std::memory_order_relaxed) >= kMissesToBackOff
               ? std::chrono::microseconds(0) : spin_;
  }
  // A drive that spun (more than one pass): it finished its op, or its budget ran out.
  void spinPaid() {
    misses_.store(0, std::memory_order_relaxed);
    probe_due_.store(false, std::memory_order_relaxed);
  }
  void spinMissed() {
    misses_.fetch_add(1, std::memory_order_relaxed);
    probe_due_.store(false, std::memory_order_relaxed);
  }

 private:
  static constexpr int kMissesToBackOff = 3;
  static constexpr uint32_t kProbeEvery = 16;

  bool drivable_ = false;  // Note [Caller drives] D
  std::chrono::microseconds spin_{0};  // HVD_CALLER_SPIN_US where drivable_, else 0
  uint64_t max_bytes_ = ~uint64_t{0};
  std::atomic<int> misses_{0};         // drives in a row whose spin ran out
  std::atomic<uint32_t> backed_off_drives_{0};
  std::atomic<bool> probe_due_{false};  // a probe that proved nothing: the next drive probes
};

}  // namespace hvd::runtime
