// ControlChannel: framed negotiation messages between a worker and rank 0 over their own TCP
// connection (separate from the data pair, so control traffic never interleaves with tensor
// bytes), or, between ranks of one host, through shared memory (attachSharedMemory; the socket
// then carries only wake bytes and the hang-up, Note [Control over shm]). Frame: u32 magic 'HVDC', u32 type, u64 length, payload. A frame with a bad magic or a
// length over kMaxControlBytes is rejected (the channel reports kInternal and must be dropped).
// Background thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/shm/ring_stream.h"

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
  // Over shared memory it never waits: what the ring cannot take now stays in the outbox for
  // flush() (Note [Control over shm] C).
  common::Status send(uint32_t type, const std::string& payload, double timeout_seconds);
  // shm: moves outbox bytes into the ring as room allows (true when any moved); every pass
  // calls it.
  bool flush();
  bool hasBacklog() const { return outbox_sent_ < outbox_.size(); }
  // Flushes, napping while the ring is full, until the outbox is empty, the peer hangs up or
  // timeout_seconds pass: before the channel is closed (a failure's kAbort, the shutdown).
  void flushFor(double timeout_seconds);
  // Reads what is available without blocking and appends every complete frame to *out.
  // kPeerLost on EOF/reset; kInternal on a malformed frame. Over shared memory the socket is
  // read only after markSocketReadable() (its poll said readable): wake bytes and hang-up.
  common::Status receive(std::vector<ControlMessage>* out);

  // From here frames go through `link` (set up by the Mesh before any frame is sent).
  void attachSharedMemory(std::unique_ptr<shm::RingStream> link);
  bool sharedMemory() const { return link_ != nullptr; }
  bool hasIncoming() const { return link_ != nullptr && link_->hasData(); }
  void markSocketReadable() { socket_readable_ = true; }
  // Waits up to timeout_ms until a frame may have arrived (or the socket hung up).
  void waitReadable(int timeout_ms);

 private:
  int fd_;
  int peer_;
  // Received bytes not yet parsed are inbox_[0, inbox_used_). The buffer keeps its size between
  // calls: growing a string by a read chunk zero-filled 64 KiB on every poll of the channel.
  std::vector<char> inbox_;
  size_t inbox_used_ = 0;
  std::unique_ptr<shm::RingStream> link_;
  bool socket_readable_ = false;
  std::string outbox_;  // shm: frames not yet in the ring are outbox_[outbox_sent_, size)
  size_t outbox_sent_ = 0;

  size_t drainLink(size_t budget);  // ring -> inbox_
  common::Status drainSocket();     // shm mode: wake bytes; kPeerLost on hang-up
  common::Status sendFailed(const common::Status& s, double timeout_seconds) const;
};

}  // namespace hvd::transport
