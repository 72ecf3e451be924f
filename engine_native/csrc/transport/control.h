// ControlChannel: framed negotiation messages between a worker and rank 0 over their own TCP
// connection (separate from the data pair, so control traffic never interleaves with tensor
// bytes). Frame: u32 magic 'HVDC', u32 type, u64 length, payload. A frame with a bad magic or a
// length over kMaxControlBytes is rejected (the channel reports kInternal and must be dropped).
// Background thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace hvd::transport {

constexpr uint32_t kControlMagic = 0x43445648;  // "HVDC" little-endian
constexpr uint64_t kMaxControlBytes = 64ull << 20;

struct ControlMessage {
  uint32_t type = 0;
  std::string payload;
};

class ControlChannel {
 public:
  ControlChannel(int fd, int peer);
  ~ControlChannel();
  int fd() const { return fd_; }
  int peer() const { return peer_; }

  // Writes the whole frame; waits (poll) up to timeout_seconds if the socket buffer is full.
  common::Status send(uint32_t type, const std::string& payload, double timeout_seconds);
  // Reads what is available without blocking and appends every complete frame to *out.
  // kPeerLost on EOF/reset; kInternal on a malformed frame.
  common::Status receive(std::vector<ControlMessage>* out);

 private:
  int fd_;
  int peer_;
  // Received bytes not yet parsed are inbox_[0, inbox_used_). The buffer keeps its size between
  // calls: growing a string by a read chunk zero-filled 64 KiB on every poll of the channel.
  std::vector<char> inbox_;
  size_t inbox_used_ = 0;
};

}  // namespace hvd::transport
