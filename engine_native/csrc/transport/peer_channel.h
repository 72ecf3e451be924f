// PeerChannel: the point-to-point connection to one peer (issue #36): one authenticated TCP
// connection per pair of ranks (Mesh::connect, kind kPeer) that carries frames of
// transport/peer_frame.h both ways, so two ranks exchange messages without any other rank.
// Between ranks of one host the frames go through shared-memory rings instead (a RingStream;
// Note [Point-to-point over shm] in peer_channel.cc) and the socket carries only wake bytes.
// It never blocks: send() queues a frame whose payload stays the caller's until it is written,
// flush() writes what the socket takes now, receive() reads what has arrived and returns the
// messages it completed, each payload in memory of its own. Owned by the Mesh; used by the
// background thread (or a caller driving the loop, under its lock) through runtime/peer_ops.h.
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/peer_frame.h"
#include "transport/shm/helper_read.h"
#include "transport/shm/ring_stream.h"

namespace hvd::transport {

// Memory for a received payload: `data` (at least the payload's bytes), kept alive by `owner`
// (null: memory a posted receive brought, Note [Receive into out] in
// runtime/peer_ops_into.cc). An allocator answers {} when it has no memory; it is asked once a
// frame's header is read, with the context given to setAllocator and the sending peer.
struct PeerPayload {
  std::shared_ptr<void> owner;
  uint8_t* data = nullptr;
};
using PeerPayloadAllocator = PeerPayload (*)(void* context, int peer, const PeerFrame& frame);
// The default allocator: aligned_alloc below 1 MiB; from 1 MiB a mapping reserved with
// MAP_NORESERVE, whose pages are committed only as the bytes fill them, so a header that claims
// a terabyte costs address space, not memory (found by the fuzz tier).
PeerPayload reservedPeerPayload(uint64_t bytes);
// The mapping reservedPeerPayload makes for `bytes`, and its release, for an allocator that
// keeps the memory in an owner of its own.
uint8_t* reservePayloadMapping(uint64_t bytes);
void releasePayloadMapping(uint8_t* data, uint64_t bytes);

struct PeerMessage {
  PeerFrame frame;
  PeerPayload payload;
};

class PeerChannel {
 public:
  PeerChannel(int fd, int peer);
  ~PeerChannel();  // closes the socket
  // Where received payloads go from now on (runtime/peer_ops_into.cc: a bound receive's `out`,
  // else the core's reused outputs).
  void setAllocator(PeerPayloadAllocator allocate, void* context) {
    allocate_ = allocate;
    allocate_context_ = context;
  }
  // The message being received, if its payload is being written to `data`, goes on in fresh
  // memory from the allocator, its bytes so far copied there: whoever brought `data` gave up
  // on it (a receive into out= that failed). Without memory for it, the message is dropped and
  // the next receive() fails with that.
  void rehomeIncoming(const uint8_t* data);
  PeerChannel(const PeerChannel&) = delete;
  PeerChannel& operator=(const PeerChannel&) = delete;

  int fd() const { return fd_; }
  int peer() const { return peer_; }
  // From now on frames go through `link`'s rings (both sides attach alike, at connect).
  void attachSharedMemory(std::unique_ptr<shm::RingStream> link) { link_ = std::move(link); }
  bool onSharedMemory() const { return link_ != nullptr; }
  // Shared memory only: wakes the peer's loop thread if it sleeps (the one-round board).
  void wakePeerLoop() const {
    if (link_ != nullptr) link_->wakePeerLoop();
  }
  // Note [Split copy] (transport/peer_split.cc): on shared memory, a host message of at least
  // `min_bytes` is copied half by each side, straight between the two processes' memory;
  // 0: never, and the peer's offers are refused. Set before the first send.
  void setSplitCopy(uint64_t min_bytes) { split_min_bytes_ = min_bytes; }
  // Note [Split copy] G: how the process's helper thread wakes this rank once it has read its
  // part of a message (any thread; `context` outlives the channel's helper reads).
  void setHelperWake(void (*wake)(void* context), void* context) {
    helper_wake_ = wake;
    helper_wake_context_ = context;
  }
  // Waits for the helper's read of this channel's message, if one runs (G): nothing writes
  // that memory or calls the wake afterwards.
  void settleHelperRead();
  // Split messages sent, received, and offers refused (either way) since the last call.
  struct SplitCounts {
    uint64_t sent = 0, received = 0, refused = 0;
  };
  SplitCounts takeSplitCounts();

  // Queues a frame; `payload` (frame.bytes long) must stay valid until flush() reports `id`
  // (a split message: until the receiver has read it, Note [Split copy]).
  void send(const PeerFrame& frame, const void* payload, uint64_t id);
  // Writes what the socket takes (sendmsg, MSG_NOSIGNAL); appends the ids of frames now wholly written to *sent and
  // sets *moved when any byte went. kPeerLost when the connection is gone.
  common::Status flush(std::vector<uint64_t>* sent, bool* moved);
  bool hasBacklog() const { return !outbox_.empty() || !control_.empty(); }
  // Whether the loop should poll the socket for POLLOUT: TCP with a backlog (a ring's room is
  // announced by a wake byte instead).
  bool wantsWritable() const { return link_ == nullptr && !outbox_.empty(); }
  // Shared memory only, seq_cst (the sleep re-check): a message waits in the incoming ring,
  // or this side has a split message's half to read, or the channel broke (receive() says so).
  bool hasIncoming() const {
    return link_ != nullptr &&
           (link_->hasData() || splitReadPending() || helperFinished() || !broken_.isOk());
  }
  // Shared memory only, after the loop announced its sleep: with a backlog, marks the ring for
  // a wake once the peer reads and says whether it has room already (then do not sleep); a
  // split send with its half to write can move too, one waiting for the peer's answer cannot.
  bool rearmWriter();
  // Forgets queued frames (their payloads may be freed next): the connection is given up.
  void dropOutbox();

  // Reads what has arrived; appends completed messages to *out and sets *moved when any byte
  // came. kPeerLost on EOF/reset, kInternal on a malformed header (the peer is not a rank of
  // this job's code, or memory is corrupt): the channel is unusable after either. On shared
  // memory the socket (wake bytes, hang-up) is read only when `socket_readable` (it polled so).
  common::Status receive(std::vector<PeerMessage>* out, bool* moved, bool socket_readable);

 private:
  // Note [Split copy]: a split send's way, from its offer to the peer's receipt.
  enum class Split : uint8_t { kNone, kOffer, kAwaitAccept, kWriting, kAwaitRead, kDone };
  struct Outgoing {
    std::string header;      // encodePeerHeader (an offer: with its payload)
    const uint8_t* payload;
    uint64_t bytes;
    uint64_t id;
    uint64_t written = 0;    // of header + payload
    bool wakes = false;      // on a ring: wakes its reader whether or not it listens
    Split split = Split::kNone;
    PeerFrame frame;         // a split send's message (its bytes at `tensor`)
    const uint8_t* tensor = nullptr;
    SplitEndpoint receiver;  // kWriting: where its half goes
    uint64_t half_written = 0;
  };
  // The message a split offer brought (Note [Split copy]): this side reads [0, end) of the
  // sender's bytes into `message`'s payload; the sender writes the rest and says so (Done),
  // or, for a posted out= (G), the process's helper thread reads it (`helper`).
  struct IncomingSplit {
    bool active = false;
    PeerMessage message;
    SplitEndpoint sender;
    uint64_t end = 0;
    uint64_t got = 0;
    bool sender_done = false;
    std::shared_ptr<shm::HelperRead> helper;
  };
  enum class Stage { kLength, kHeader, kPayload, kControl };

  common::Status parse(std::vector<PeerMessage>* out);  // from inbox_
  common::Status receiveRing(std::vector<PeerMessage>* out, bool* moved, bool socket_readable);
  common::Status writeFrames(std::vector<uint64_t>* sent, bool* moved);
  // Note [Split copy] (peer_split.cc).
  bool splitEligible(const PeerFrame& frame) const;
  void offer(Outgoing* o);
  void queueControl(PeerFrameKind kind, const std::string& payload);
  common::Status writeControl(bool* moved);
  bool controlMidFrame() const { return control_written_ > 0; }
  common::Status handleControl(const PeerFrame& frame, const uint8_t* payload);
  common::Status takeOffer(const PeerFrame& frame, const SplitEndpoint& sender);
  common::Status takeAccept(const SplitEndpoint& receiver);
  common::Status writeHalf(Outgoing* o, bool* moved);
  common::Status readHalf(bool* moved);
  common::Status completeSplit(std::vector<PeerMessage>* out);
  void readAll(PeerFrame frame, PeerPayload out, const SplitEndpoint& sender);  // G
  bool rehomeReadAll(const uint8_t* data);  // G
  bool helperFinished() const {
    return split_in_.active && split_in_.helper != nullptr &&
           split_in_.helper->finished.load(std::memory_order_seq_cst);
  }
  static void keepForever(std::shared_ptr<void> owner);
  bool splitReadPending() const { return split_in_.active && split_in_.got < split_in_.end; }
  bool verified(const SplitEndpoint& peer);
  void stopOffering();
  static void sendWhole(Outgoing* o);

  common::Status startPayload();
  // "out of memory for <what> point-to-point message of N bytes from rank R"
  common::Status outOfMemory(uint64_t bytes, const char* what) const;
  static PeerPayload defaultAllocator(void*, int, const PeerFrame& frame) {
    return reservedPeerPayload(frame.bytes);
  }
  // One write or read of the transport: bytes moved, 0 when it takes or has none now, -1 with
  // errno on a socket error.
  ssize_t writeSome(const iovec* iov, int count, bool always_wake);
  ssize_t readSome(uint8_t* dst, size_t room);
  bool paused();  // the test switch PEER_PAUSE_AT_BYTES holds

  int fd_;
  int peer_;
  std::unique_ptr<shm::RingStream> link_;  // null: frames go over the socket
  PeerPayloadAllocator allocate_ = defaultAllocator;
  void* allocate_context_ = nullptr;
  std::deque<Outgoing> outbox_;
  std::vector<uint8_t> inbox_;      // bytes read, not parsed yet: [inbox_begin_, inbox_end_)
  size_t inbox_begin_ = 0, inbox_end_ = 0;
  Stage stage_ = Stage::kLength;
  uint32_t header_bytes_ = 0;
  PeerMessage incoming_;            // stage kPayload: the message being filled
  uint64_t payload_got_ = 0;
  // rehomeIncoming found no memory, or gave up a split message its sender still writes:
  // receive() fails with it
  common::Status broken_;
  // Test switch PEER_PAUSE_AT_BYTES (peer_channel.cc); 0: none.
  uint64_t pause_at_ = 0;
  const char* pause_file_ = nullptr;
  uint64_t written_ = 0;            // bytes written to the ring (pause_at_ compares)
  // Note [Split copy].
  uint64_t split_min_bytes_ = 0;
  bool split_refused_ = false;      // the peer refused an offer, or could not be verified
  int peer_identity_ = 0;           // 1: verified, -1: could not be (read once per channel)
  SplitEndpoint verified_;          // ... the endpoint it was verified for (pid and word)
  PeerPayload whole_;               // F: a posted out= given to an offer sent whole instead
  PeerFrame whole_frame_;           // ... that offer's message
  std::deque<std::string> control_;  // whole frames, written before the outbox's next
  uint64_t control_written_ = 0;    // of control_.front()
  IncomingSplit split_in_;
  SplitCounts split_counts_;
  void (*helper_wake_)(void*) = nullptr;  // G
  void* helper_wake_context_ = nullptr;
};

}  // namespace hvd::transport
