// RingStream: a byte stream each way between two ranks of one host through a pair of rings in
// shared memory, for a channel that would otherwise use its TCP socket: the control channel
// (transport/control.h, Segment::controlRing) and the point-to-point channel
// (transport/peer_channel.h, Segment::peerRing). A write costs a memcpy and, only when the
// receiver sleeps in poll(), one wake byte on the channel's socket (the protocol of Note
// [Doorbell ordering] with the doorbell of the rings' kind). The socket stays open: it carries
// the wake bytes and its hang-up is how a lost peer is seen. Note [Control over shm] in
// ring_stream.cc.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

#include "transport/shm/segment.h"

namespace hvd::transport::shm {

class RingStream {
 public:
  // When a write wakes a sleeping peer: for every write (control frames, which the peer's
  // loop must answer), or only while the peer listens (its doorbell's `listening`) or the
  // write did not fit (the peer must make room): point-to-point frames, which wait in the
  // ring until the peer asks for them (Note [Point-to-point over shm] B).
  enum class Wakes { kEveryWrite, kWhileListening };

  // link: the rings (outgoing: the peer's ring for this rank); its socket is the channel's
  // connection (owned by the channel).
  explicit RingStream(const RingLink& link, Wakes wakes = Wakes::kEveryWrite)
      : link_(link), wakes_(wakes) {}

  // Never blocks: writes what fits and wakes the peer if it sleeps. Bytes left over stay with
  // the caller, who calls again; the peer wakes this rank once it has read (Note [Control
  // over shm] C).
  size_t write(const uint8_t* data, size_t n);
  // The same for pieces written in order as one stream (a frame's header and payload), with
  // at most one wake: stops at the first piece the ring cannot take whole. `always_wake`: a
  // sleeping peer is woken whatever `Wakes` says (a frame its loop must answer).
  size_t writeGather(const iovec* pieces, int count, bool always_wake = false);
  // After the owner announced its sleep, with bytes left over: marks the ring for a wake and
  // says whether it has room already (Note [Control over shm] C).
  bool rearm();
  // Reads what is there; wakes the peer if it waits for room.
  size_t read(uint8_t* dst, size_t n);
  bool hasData() const { return link_.incoming.hasData(); }  // seq_cst: the sleep re-check
  Doorbell* ownDoorbell() const { return link_.own_doorbell; }
  // Wakes the peer's loop thread if it sleeps (shm::wakeLoop), for news outside the rings.
  void wakePeerLoop() const { wakeLoop(link_.peer_doorbell, link_.socket_fd); }

 private:
  bool wakeAfterWrite(size_t written, size_t asked, bool always_wake = false) const;

  RingLink link_;
  Wakes wakes_;
};

}  // namespace hvd::transport::shm
