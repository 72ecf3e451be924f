// PeerOps: this rank's point-to-point operations (issue #36): send a tensor to one rank,
// receive one from another, matched by (peer, tag) in the order each side issued them, with no
// round through rank 0 — each pair of ranks has its own connection (transport/peer_channel.h)
// and agrees alone. Every message carries its dtype and shape, so a receive needs neither.
// Framework threads submit (thread-safe, under mutex_); the background loop, or a caller that
// drives it (under its progress_ lock), calls the rest each pass. Note [Point-to-point] in
// peer_ops.cc has the rules; CUDA tensors between ranks of one host go through DevicePeerOps
// (Note [Device point-to-point]).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "runtime/device_nccl_peers.h"
#include "runtime/device_peer_ops.h"
#include "runtime/handle_table.h"
#include "runtime/metrics.h"
#include "runtime/peer_request.h"
#include "runtime/ready_events.h"
#include "timeline/timeline.h"
#include "transport/mesh.h"

namespace hvd::runtime {

class SubmissionQueue;

class PeerOps {
 public:
  using Clock = std::chrono::steady_clock;

  // `timeline` (may be null) gets a SEND or RECV span per op, from its submission to its end.
  // cuda_ipc: CUDA tensors may go by CUDA IPC (HVD_GPU_PATH is not "staged"); nccl_demanded:
  // HVD_GPU_PATH=nccl (Note [NCCL point-to-point] A); split_min_bytes: HVD_P2P_SPLIT_MIN_BYTES
  // (Note [Split copy] in transport/peer_split.cc).
  PeerOps(transport::Mesh& mesh, HandleTable& handles, SubmissionQueue& queue, Metrics& metrics,
          timeline::Timeline* timeline, double timeout_seconds, bool cuda_ipc,
          bool nccl_demanded, uint64_t split_min_bytes);
  ~PeerOps();

  // ---- framework threads ----
  // caller_waits and wake as SubmissionQueue::submit's (Note [Caller drives]: the caller blocks
  // on the handle at once and drives it, so the loop thread is not woken).
  common::Status submitSend(PeerSend send, bool caller_waits, bool wake, int64_t* handle);
  // The handle completes with the message's payload, shape and dtype (OpResult).
  common::Status submitRecv(const PeerRecv& recv, bool caller_waits, bool wake, int64_t* handle);
  // How a CUDA tensor travels to `peer`: "nccl" (Note [NCCL point-to-point] A), "ipc" (a
  // rank of this host, Note [Device point-to-point] A), "staged" (through host memory, by
  // the binding: another host, HVD_GPU_PATH=staged, or a peer that could not read this
  // rank's CUDA memory: G), "" for no channel (this rank, or out of range). Any thread.
  const char* cudaRoute(int peer) const;

  // ---- the loop (under progress_) ----
  // Takes new ops, writes and reads every channel, matches, completes handles, times out ops
  // idle for HVD_TIMEOUT; true when it moved anything. An error is the rank's: the loop fails.
  common::Status progress(bool* moved);
  // Nothing pending (submitted, queued, posted or being written) and no unread ring bytes.
  bool idle() const;
  // Whether a pass since the last call moved bytes (Note [Caller drives] G: spin on).
  bool takeMoved();
  // Posted receives and unfinished sends for metrics()["pending"] (op RECV/SEND, the peer).
  void appendPending(Clock::time_point now, std::vector<PendingInfo>* out) const;
  // Every channel's socket and peer, with POLLOUT where frames wait for a TCP socket.
  void pollSet(std::vector<int>* fds, std::vector<short>* events, std::vector<int>* peers) const;
  // Before the loop thread polls them: announces its sleep to channels on shared memory and
  // answers whether one can move already (then it must not sleep); endSleep after the poll.
  // A caller driving the loop says so with setDriving (Note [Point-to-point over shm] B, C).
  bool announceSleep();
  void endSleep();
  void setDriving(bool driving);
  // A caller about to sleep until a ring moves (Note [Point-to-point over shm] G): announces it
  // on the peer doorbell, whose futex word's value before that is *seen, and answers the
  // doorbell to FUTEX_WAIT on; null when a ring can move already or this rank has no shared
  // memory. endCallerSleep() after the wait, also when null was answered (a thread without
  // progress_ clears the bit through Mesh::markPeerDoorbell instead).
  transport::shm::Doorbell* announceCallerSleep(uint32_t* seen);
  void endCallerSleep();
  // B, G: after a sleep was announced, or a caller's `driving` mark cleared (under progress_).
  bool ringsCanMove();
  // The loop's poll found `peer`'s socket readable (or hung up): the next pass reads it. A pass
  // reads a socket only then, or while a receive from that peer is posted or the board waits.
  void markReadable(int peer) { readable_[peer] = 1; }
  // Note [One round] K: sendBoard queues a board frame to `peer` (written as the socket takes
  // it); arrivals go to the sink; passes read non-shm sockets while `waiting` and in a drive while
  // no loop poll watches them (Note [Caller drives] D); readArrived waits for one, reads all.
  using BoardSink = std::function<common::Status(int peer, const transport::PeerMessage&)>;
  void setBoardSink(BoardSink sink) { board_sink_ = std::move(sink); }
  void sendBoard(int peer, transport::PeerFrameKind kind, int64_t tag, std::string payload);
  void setBoardWaiting(bool waiting) { board_waiting_ = waiting; }
  void setSocketsWatched(bool on) { sockets_watched_.store(on); }  // by the loop thread
  void readArrived(const std::vector<int>& peers, int wait_ms, std::vector<int>* lost);
  // Note [Caller waits on the device] F (device_executor.cc): the handle a driving caller
  // waits on (-1: none), whose CUDA copies it polls itself (pollDevice, under progress_).
  void setAwaitedHandle(int64_t handle) { device_.setAwaitedHandle(handle); }
  bool callerPollsDevice(int64_t handle) const { return device_.callerPolls(handle); }
  bool callerPollsAnyDevice() const { return device_.callerPollsAny(); }  // any thread
  common::Status pollDevice();
  // Completes every pending op with `status`; later submissions fail with it.
  void failAll(const common::Status& status);
  // The rank shuts down (Note [Point-to-point] F in peer_ops_shutdown.cc): posted receives
  // and later submissions fail with `status`; what is already in flight goes on, and so do
  // the answers this rank owes its peers, until the loop ends (then failAll).
  void beginShutdown(const common::Status& status);

 private:
  struct Op {
    int64_t handle = 0;
    int peer = -1;
    int64_t tag = 0;
    bool is_send = false;
    // A receive: its `into`'s, until a device read sets the message's
    common::DataType dtype = common::DataType::kUint8;
    std::vector<int64_t> shape;
    const void* data = nullptr;
    uint8_t* into = nullptr;  // a receive's out= memory (Note [Receive into out])
    bool bound = false;       // ... a message is being written there
    int device = -1;          // send: the CUDA tensor's; receive: the device that reads one
    bool on_device = false;   // receive: a CUDA tensor's result stays on `device`
    int64_t consumer = -1;    // ... and the stream that waits for its bytes (PeerRecv)
    ReadyEvent ready;         // a CUDA send: its producer's stream at submission
    std::shared_ptr<const std::string> payload;  // a CUDA send's frame: its DeviceMessage
    bool copied = false;      // a CUDA send: its staging copy finished
    bool awaiting_resend = false;  // a CUDA receive refused (Note [Device point-to-point] G)
    uint64_t sequence = 0;         // ... of this device message; an NCCL receive's slot
    bool by_nccl = false;          // Note [NCCL point-to-point]
    bool expects = false;          // a receive: refuses a message not of dtype x shape
    uint64_t ordinal = 0;          // a send: its message's number to its peer
    common::Status refusal;        // a send in flight that was refused: fails with it
    Clock::time_point since;  // posted, or last progress on its channel
    std::string span;         // its timeline span's name; empty when none was recorded
  };
  struct Arrived {  // a message no receive has matched yet
    int64_t tag;
    transport::PeerMessage message;
    transport::DeviceMessage device;  // a kDevice message's
    uint64_t slot = 0;                      // a kDeviceNccl message's (its ncclRecv)
    std::shared_ptr<OutputBuffer> nccl_bytes;  // ... once that finished
    uint64_t ordinal = 0;  // its number among the peer's messages (Note [Refused messages])
  };
  struct PerPeer {
    std::deque<Op> sending;      // queued on the channel, in order
    std::deque<Op> staged;       // CUDA sends written, their copies still running
    std::deque<Op> receiving;    // posted receives, in order
    std::deque<Op> reading;      // receives of CUDA tensors whose copies run
    std::deque<Arrived> arrived;  // unmatched messages, in arrival order
    std::deque<std::string> receipts;  // kDeviceRead, kNcclId and board payloads queued, in order
    std::deque<std::shared_ptr<OutputBuffer>> resends;  // kDeviceResend payloads, in order
    // Note [Refused messages]: kRefused payloads queued, in order; messages sent and arrived
    // (kHost, kDevice, kDeviceNccl); a refusal that waits for the next op, and how many more
    std::deque<std::string> refusals;
    uint64_t sent_messages = 0, arrived_messages = 0;
    common::Status refused;
    uint64_t refused_more = 0;
    bool refused_in_flight = false;  // ... and the refused send raises it itself
  };

  // Ids of queued receipts (and board frames), resends, refusals, resend copies (> handles).
  static constexpr uint64_t kReceiptId = ~uint64_t{0};
  static constexpr uint64_t kResendId = ~uint64_t{0} - 1;
  static constexpr uint64_t kRefusalId = ~uint64_t{0} - 2;
  static constexpr uint64_t kRestageBit = uint64_t{1} << 62;
  // "send to rank 1 (tag 5)", "recv from rank 0 (tag 5)": errors and spans name ops so.
  static std::string what(const char* kind, int peer, int64_t tag);
  static std::string seconds(double s);  // 30 -> "30", 0.5 -> "0.5"
  // A failure that ends `op` (a lost peer, abort, shutdown) as its caller sees it: prefixed
  // with what(op), unless the cause already names that op (its own timeout).
  static common::Status failureOf(const Op& op, const common::Status& status);

  common::Status submit(Op op, bool caller_waits, bool wake, int64_t* handle);
  common::Status takeSubmitted(bool* moved);
  common::Status progressPeer(int peer, Clock::time_point now, bool* moved);
  // Reads what `peer`'s channel has, files it (arrive) and matches it.
  common::Status readPeer(int peer, Clock::time_point now, bool* read);
  void match(PerPeer& p);
  // Every receive that succeeds ends here, whatever its route: counted, its span ended, its
  // handle completed with the result (`buffer` null: the bytes are in its own `into`).
  void completeReceive(const Op& op, std::shared_ptr<OutputBuffer> buffer,
                       std::vector<int64_t> shape, common::DataType dtype);
  // A receive its route could not complete: no longer listened for, failed with `status`
  // under its own name ("recv from rank 1 (tag 5): ...").
  void failReceive(const Op& op, const common::Status& status);
  // Note [Receive into out] (peer_ops_into.cc): where an arriving payload goes, and the way
  // back for a bound receive that ends without its message.
  static transport::PeerPayload payloadFor(void* self, int peer,
                                           const transport::PeerFrame& frame);
  static void helperFinished(void* self);  // Note [Split copy] G: wakes whoever drives
  transport::PeerPayload bindOrAllocate(int peer, const transport::PeerFrame& frame);
  void unbind(const Op& op);
  // C, for the ops a failure or shutdown ends: each receive unbound before its completion
  // (after which its caller may reuse or free `into`). failTaken completes taking_ (the
  // submissions taken under the lock) with `status`; takeReceives empties p.receiving.
  void failTaken(const common::Status& status);
  std::deque<Op> takeReceives(PerPeer& p);
  // Note [Refused messages] (peer_ops_into.cc): the receiver's side (A), the sender's (B, C).
  void refuseIfUnfit(const Op& receive, const Arrived& message);
  common::Status refusedBy(int peer, PerPeer& p, const transport::PeerMessage& message);
  void settleRefusal(PerPeer& p);  // B, C: after a read's matches, and after a take
  common::Status takeRefusal(PerPeer& p);  // the waiting refusal, as raised; spent
  void noteSent(Op& op) { op.ordinal = peers_[op.peer].sent_messages++; }
  // The CUDA messages (peer_ops_device.cc, Note [Device point-to-point]).
  void stageDeviceSend(Op& op);          // B
  void startDeviceRead(PerPeer& p, Op op, Arrived message);  // D
  common::Status orderOnConsumer(const PeerRecv& recv, Op* op);  // I, at submission
  void sendReceipt(int peer, uint64_t sequence,
                   transport::PeerFrameKind kind = transport::PeerFrameKind::kDeviceRead);
  common::Status refused(int peer, uint64_t sequence);       // G, the sender
  common::Status resent(PerPeer& p, transport::PeerMessage message);  // G, the receiver
  void completeResend(uint64_t id, std::shared_ptr<OutputBuffer> bytes);
  common::Status arrive(int peer, PerPeer& p, transport::PeerMessage message);
  common::Status progressDevice();
  common::Status flushPeer(int peer, Clock::time_point now, bool* wrote);
  // NCCL messages (peer_ops_nccl.cc, Note [NCCL point-to-point]).
  void stageNcclSend(Op& op);                                      // B
  common::Status arriveNccl(int peer, PerPeer& p, transport::PeerMessage message);  // C, D
  void startNcclRead(PerPeer& p, Op op, Arrived& arrived);         // D
  void completeNcclRead(const Op& op, std::shared_ptr<OutputBuffer> bytes);  // E
  common::Status progressNccl();
  void deviceSendDone(int64_t handle);  // a CUDA send's bytes are taken: it may complete
  void completeSend(const Op& op);
  void fail(const Op& op, const common::Status& status);  // this op alone
  void timeOut(PerPeer& p, Clock::time_point now);
  // F: a message that arrives once this rank shuts down (no receive will take it).
  void dropArrival(int peer, const Arrived& arrived);
  // F: `peer`'s connection failed while this rank shuts down: its ops fail, it is left alone.
  void closePeer(int peer, const common::Status& status);
  bool open(int peer) const { return mesh_.peerChannel(peer) != nullptr && closed_[peer] == 0; }
  void listen(int delta);  // a receive opened (+1) or completed (-1)
  void markDoorbell(uint32_t bit, bool on);  // a Doorbell::driving bit, under progress_
  void startSpan(Op& op);
  void endSpan(const Op& op, const common::Status& status = common::Status::ok());

  transport::Mesh& mesh_;
  HandleTable& handles_;
  SubmissionQueue& queue_;
  Metrics& metrics_;
  timeline::Timeline* timeline_;
  const std::chrono::duration<double> timeout_;
  const bool cuda_ipc_;
  const bool nccl_demanded_;

  mutable std::mutex mutex_;  // guards submitted_ and failure_
  std::vector<Op> submitted_;
  // submitted_ may be non-empty: set under mutex_ with a push, cleared by takeSubmitted.
  std::atomic<bool> submissions_waiting_{false};
  common::Status failure_;   // sticky once set

  // The loop's (under progress_).
  std::vector<PerPeer> peers_;
  std::vector<uint8_t> readable_;  // by peer: markReadable since the last read
  std::vector<uint8_t> read_early_;  // by peer: takeSubmitted read it in this pass
  bool shutting_down_ = false;     // F
  std::vector<uint8_t> closed_;    // by peer: its connection failed while shutting down (F)
  bool moved_since_taken_ = false;
  BoardSink board_sink_;  bool board_waiting_ = false;  // Note [One round] K
  std::atomic<bool> sockets_watched_{false};  bool caller_drives_ = false;  // Caller drives D
  std::vector<Op> taking_;   // storage reused by takeSubmitted
  std::vector<uint64_t> sent_;
  std::vector<transport::PeerMessage> received_;
  HostCopyStreams host_copies_;  // before device_ and nccl_: it outlives them
  DevicePeerOps device_;
  std::vector<DevicePeerOps::Done> device_done_;
  DeviceNcclPeers nccl_;
  std::vector<DeviceNcclPeers::Done> nccl_done_;
  // G: by peer, whether it refused this rank's CUDA memory (read by cudaRoute, any thread).
  std::vector<std::atomic<bool>> ipc_refused_;
  std::map<uint64_t, std::pair<int, uint64_t>> restaging_;  // id -> (peer, sequence)
  uint64_t next_restage_ = 0;
};

}  // namespace hvd::runtime
