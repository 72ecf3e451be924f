// Pair: a byte stream to one peer, used only by the background thread inside a collective.
// Non-blocking: sendSome/recvSome move what they can now; Comm::exchange (transport/comm.h)
// waits for readiness across many pairs. Both sides issue matching sends/receives in the same
// order (every rank executes the response list in the same order), so no framing is needed.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/status.h"

namespace hvd::transport {

enum class PairKind { kTcp, kShm };

class Pair {
 public:
  virtual ~Pair() = default;
  virtual PairKind kind() const = 0;
  virtual int peer() const = 0;
  // Move up to n bytes without blocking; *moved receives the count (0 if the pair is not ready).
  // Errors: kPeerLost (EOF/reset/peer gone).
  virtual common::Status sendSome(const uint8_t* data, size_t n, size_t* moved) = 0;
  virtual common::Status recvSome(uint8_t* data, size_t n, size_t* moved) = 0;
  // The socket to poll for readiness (TCP), or -1 for shm (which wakes the owner's doorbell).
  virtual int pollFd() const = 0;
};

}  // namespace hvd::transport
