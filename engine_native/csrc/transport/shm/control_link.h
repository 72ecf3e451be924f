// ControlLink: the shared-memory half of a ControlChannel (transport/control.h) between two
// ranks of one host. Frames travel through a control ring in the receiver's segment
// (Segment::controlRing) instead of the TCP socket: a message costs two memcpys and, only when
// the receiver's loop thread is asleep in poll(), one wake byte on the socket (the protocol of
// Note [Doorbell ordering] with the segment's control doorbell). The socket stays open: it
// carries the wake bytes and its hang-up is how a lost peer is seen. Note [Control over shm]
// in control_link.cc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "transport/shm/segment.h"

namespace hvd::transport::shm {

class ControlLink {
 public:
  // link: the control rings (outgoing: the peer's control ring for this rank); its socket is
  // the control connection (owned by the channel).
  explicit ControlLink(const RingLink& link) : link_(link) {}

  // Never blocks: writes what fits and wakes the peer if it sleeps. Bytes left over stay with
  // the caller, who calls again; the peer wakes this rank once it has read (Note [Control
  // over shm] C).
  size_t write(const uint8_t* data, size_t n);
  // Reads what is there; wakes the peer if it waits for room.
  size_t read(uint8_t* dst, size_t n);
  bool hasData() const { return link_.incoming.hasData(); }  // seq_cst: the sleep re-check
  Doorbell* ownDoorbell() const { return link_.own_doorbell; }

 private:
  RingLink link_;
};

}  // namespace hvd::transport::shm
