// Point-to-point operations (runtime/peer_ops.h).
//
// Note [Point-to-point]
//   A. Ranks are global ranks; a process set plays no part. A rank cannot send to itself.
//   B. Order: a pair's connection is one byte stream, so messages from a rank arrive in the
//      order it sent them. A receive takes the first arrived message from its peer with its
//      tag; an arriving message goes to the first posted receive from that peer with its tag,
//      else waits (its payload already here: sends never wait for a receive) until one is
//      posted. So two messages with one tag are received in the order they were sent (MPI's
//      non-overtaking rule), and tags let a receiver take messages in another order.
//   C. A send completes when its last byte is in the socket or the peer's ring, or, split
//      (Note [Split copy] in transport/peer_split.cc), when the receiver says it has them all;
//      its tensor is not touched after.
//   D. Errors, never hangs. A lost or malformed connection fails the whole rank (the loop's
//      failure: every pending op on every rank fails, Note [Failure fan-out]). A send that
//      writes nothing for HVD_TIMEOUT also fails the rank: its frame is half written and the
//      connection cannot be used again (a stopped peer). A receive that gets no byte from its
//      peer for HVD_TIMEOUT fails alone, naming the peer and tag; its message, if it comes
//      later, waits for the next receive of that tag. A receive given out= refuses a message
//      of another dtype or shape, and its sender raises too (Note [Refused messages]).
//   E. A blocking send or receive (submitted for an at-once wait) is driven by its caller
//      (Note [Caller drives]): the loop thread is not woken, the caller's passes write the
//      frame or read the socket for up to its spin budget, then it blocks and the loop thread
//      takes over, woken. Async ones (isend/irecv) are written or posted by their caller
//      where callers can drive (Note [Caller drives] H), and a wait on them drives too;
//      elsewhere they are the loop thread's, woken by the submission or by the connection (a
//      caller driving anything meanwhile moves them too: every pass does).
//   F. Shutdown. A rank that shuts down still owes its peers answers: a CUDA message it sent
//      may be refused after its send completed, and only this rank can resend the bytes (Note
//      [Device point-to-point] G). So until the shutdown agreement ends (every rank shut down,
//      or HVD_TIMEOUT), the loop goes on moving frames: posted receives and new submissions
//      fail with the shutdown, sends and reads already started complete, arriving messages
//      are dropped (a CUDA one's room released), refusals are answered. A peer whose
//      connection fails meanwhile (it finished first) is left alone; the rank does not fail.
#include "runtime/peer_ops.h"

#include <poll.h>

#include <cstdlib>
#include <utility>

#include "common/check.h"
#include "common/text.h"

#include "runtime/submission_queue.h"
#include "transport/shm/segment.h"

namespace hvd::runtime {

using common::Status;

std::string PeerOps::seconds(double s) {
  common::Text os;
  os << s;
  return os.str();
}

std::string PeerOps::what(const char* kind, int peer, int64_t tag) {
  return std::string(kind) + (kind[0] == 's' ? " to rank " : " from rank ") +
         std::to_string(peer) + " (tag " + std::to_string(tag) + ")";
}

PeerOps::PeerOps(transport::Mesh& mesh, HandleTable& handles, SubmissionQueue& queue,
                 Metrics& metrics, timeline::Timeline* timeline, double timeout_seconds,
                 bool cuda_ipc, bool nccl_demanded, uint64_t split_min_bytes)
    : mesh_(mesh), handles_(handles), queue_(queue), metrics_(metrics), timeline_(timeline),
      timeout_(timeout_seconds), cuda_ipc_(cuda_ipc), nccl_demanded_(nccl_demanded),
      peers_(static_cast<size_t>(mesh.size())), readable_(static_cast<size_t>(mesh.size()), 0),
      read_early_(static_cast<size_t>(mesh.size()), 0),
      closed_(static_cast<size_t>(mesh.size()), 0),
      device_(queue.wakeFd(), timeout_seconds, host_copies_),
      nccl_(mesh, queue.wakeFd(), timeout_seconds, host_copies_),
      ipc_refused_(static_cast<size_t>(mesh.size())) {
  for (int peer = 0; peer < mesh.size(); ++peer) {
    if (transport::PeerChannel* channel = mesh.peerChannel(peer)) {
      channel->setAllocator(&PeerOps::payloadFor, this);  // Note [Receive into out]
      channel->setSplitCopy(split_min_bytes);
      channel->setHelperWake(&PeerOps::helperFinished, this);  // Note [Split copy] G
    }
  }
}

// No helper read (Note [Split copy] G) calls helperFinished later: run() ends with failAll,
// which settles every bound one, and the mesh's close, whose channels settle the rest. (The
// mesh may be gone by now: nothing here may touch it.)
PeerOps::~PeerOps() = default;

// Note [Split copy] G, on the helper thread: the pass that completes its message must run. A
// caller may sleep on the doorbell; the loop thread in its poll (a submission's wake).
void PeerOps::helperFinished(void* self) {
  auto* ops = static_cast<PeerOps*>(self);
  ops->mesh_.ringPeerDoorbell();
  ops->queue_.wakeIfAsleep();
  ops->queue_.wakeForWaiter();  // a napping loop too (Note [Coalesced wakes])
}

Status PeerOps::submitSend(PeerSend send, bool caller_waits, bool wake, int64_t* handle) {
  Op op;
  op.peer = send.peer;
  op.tag = send.tag;
  op.is_send = true;
  op.dtype = send.dtype;
  op.shape = std::move(send.shape);
  op.data = send.data;
  op.device = send.device;
  if (op.device >= 0) {  // Note [Device point-to-point] A, B; Note [NCCL point-to-point] A
    uint64_t bytes = 0;
    const std::string route = cudaRoute(op.peer);
    op.by_nccl = route == "nccl";
    if (transport::peerPayloadBytes(op.dtype, op.shape, &bytes) && bytes == 0) {
      op.device = -1;  // nothing to read on the device: an empty host message
    } else if (route == "ipc" || route == "nccl") {
      const auto producer = reinterpret_cast<transport::nccl::CudaStream>(send.stream);
      HVD_RETURN_IF_ERROR(refuseGraphCapture(send.stream, what("send", op.peer, op.tag)));
      HVD_RETURN_IF_ERROR(op.ready.record(op.device, producer));
    } else if (op.peer >= 0 && op.peer < mesh_.size() && op.peer != mesh_.rank()) {
      return common::invalidArgument(what("send", op.peer, op.tag) + ": the core moves a CUDA "
                                     "tensor by NCCL (NCCL loaded, another host or "
                                     "HVD_GPU_PATH=nccl) or by CUDA IPC to a rank of this host, "
                                     "never with HVD_GPU_PATH=staged; stage it through host "
                                     "memory");
    }
  }
  return submit(std::move(op), caller_waits, wake, handle);
}

Status PeerOps::submitRecv(const PeerRecv& recv, bool caller_waits, bool wake,
                           int64_t* handle) {
  Op op;
  op.peer = recv.peer;
  op.tag = recv.tag;
  op.device = recv.device;
  op.on_device = recv.on_device && recv.device >= 0;
  op.into = recv.into;
  op.expects = recv.expects || recv.into != nullptr;
  op.dtype = recv.into_dtype;
  op.shape = recv.into_shape;
  HVD_RETURN_IF_ERROR(orderOnConsumer(recv, &op));
  return submit(std::move(op), caller_waits, wake, handle);
}

const char* PeerOps::cudaRoute(int peer) const {
  const transport::PeerChannel* channel =
      peer >= 0 && peer < mesh_.size() ? mesh_.peerChannel(peer) : nullptr;
  if (channel == nullptr) return "";
  if (cuda_ipc_ && (nccl_demanded_ || !mesh_.sameHost(mesh_.rank(), peer)) &&
      DeviceNcclPeers::available()) {
    return "nccl";
  }
  const bool ipc = channel->onSharedMemory() && cuda_ipc_ &&
                   !ipc_refused_[peer].load(std::memory_order_relaxed);
  return ipc ? "ipc" : "staged";
}

Status PeerOps::submit(Op op, bool caller_waits, bool wake, int64_t* handle) {
  const char* kind = op.is_send ? "send" : "recv";
  if (op.peer < 0 || op.peer >= mesh_.size()) {
    return common::invalidArgument(what(kind, op.peer, op.tag) + ": no such rank; ranks are 0.." +
                                   std::to_string(mesh_.size() - 1));
  }
  if (op.peer == mesh_.rank()) {
    return common::invalidArgument(what(kind, op.peer, op.tag) + ": this is the rank itself; "
                                   "point-to-point needs another rank");
  }
  if (op.tag < 0) return common::invalidArgument(what(kind, op.peer, op.tag) + ": tags are >= 0");
  if (op.shape.size() > transport::kMaxPeerDims) {
    return common::invalidArgument(what(kind, op.peer, op.tag) + ": " +
                                   std::to_string(op.shape.size()) + " dimensions, at most " +
                                   std::to_string(transport::kMaxPeerDims));
  }
  uint64_t bytes = 0;
  if (op.is_send && !transport::peerPayloadBytes(op.dtype, op.shape, &bytes)) {
    return common::invalidArgument(what(kind, op.peer, op.tag) + ": bad shape");
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!failure_.isOk()) return failureOf(op, failure_);
    op.handle = handles_.create(caller_waits, coord::Key(), /*point_to_point=*/true);
    *handle = op.handle;
    if (!op.is_send) listen(+1);  // before any pass looks for its message
    submitted_.push_back(std::move(op));
    submissions_waiting_.store(true, std::memory_order_release);
  }
  if (wake) queue_.wakeIfAsleep();
  return Status::ok();
}

Status PeerOps::takeSubmitted(bool* moved) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    taking_.swap(submitted_);
    submissions_waiting_.store(false, std::memory_order_relaxed);
  }
  if (taking_.empty()) return Status::ok();
  const Clock::time_point now = Clock::now();
  // Note [Refused messages] C: a refusal already here fails the peer's next op, so what its
  // channel holds is read first (the receives being taken may be written into: A of Note
  // [Receive into out] finds them in taking_). Once per peer: a batch's ops share it.
  for (const Op& op : taking_) {
    if (read_early_[op.peer] != 0 || !open(op.peer) ||
        (readable_[op.peer] == 0 && !mesh_.peerChannel(op.peer)->hasIncoming())) {
      continue;
    }
    bool read = false;
    const Status status = readPeer(op.peer, now, &read);
    read_early_[op.peer] = 1;
    *moved = *moved || read;
    if (!status.isOk()) {
      failTaken(status);
      return status;
    }
  }
  for (Op& op : taking_) {
    op.since = now;
    startSpan(op);
    PerPeer& p = peers_[op.peer];
    if (op.is_send && !p.refused.isOk()) {  // Note [Refused messages] C
      fail(op, failureOf(op, takeRefusal(p)));
      continue;
    }
    if (op.is_send && op.device >= 0) {
      stageDeviceSend(op);
    } else if (op.is_send) {
      transport::PeerFrame frame;
      frame.tag = op.tag;
      frame.dtype = op.dtype;
      frame.shape = op.shape;
      transport::peerPayloadBytes(op.dtype, op.shape, &frame.bytes);
      noteSent(op);
      mesh_.peerChannel(op.peer)->send(frame, op.data, static_cast<uint64_t>(op.handle));
      p.sending.push_back(std::move(op));
    } else {
      nccl_.useDevice(op.peer, op.device);  // Note [NCCL point-to-point] C
      p.receiving.push_back(std::move(op));
      match(p);
    }
  }
  taking_.clear();
  for (PerPeer& p : peers_) {  // C: a receive that did not get its message at once
    if (!p.refused.isOk()) settleRefusal(p);
  }
  return Status::ok();
}

Status PeerOps::progress(bool* moved) {
  // A pass of a host's small collectives comes here too: no lock and no clock while no
  // point-to-point op exists (a message arriving unasked needs neither).
  if (submissions_waiting_.load(std::memory_order_acquire)) {
    HVD_RETURN_IF_ERROR(takeSubmitted(moved));
  }
  HVD_RETURN_IF_ERROR(progressDevice());
  HVD_RETURN_IF_ERROR(progressNccl());
  bool timed = false;  // an op whose HVD_TIMEOUT runs (the only readers of `now`)
  for (const PerPeer& p : peers_) {
    timed = timed || !p.sending.empty() || !p.receiving.empty() || !p.reading.empty();
  }
  const Clock::time_point now = timed ? Clock::now() : Clock::time_point();
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
    if (!open(peer)) continue;
    const Status status = progressPeer(peer, now, moved);
    if (status.isOk()) continue;
    if (!shutting_down_) return status;
    closePeer(peer, status);  // F: a peer that finished its shutdown first closes, say
  }
  moved_since_taken_ = moved_since_taken_ || *moved;
  return Status::ok();
}

bool PeerOps::takeMoved() {
  const bool moved = moved_since_taken_;
  moved_since_taken_ = false;
  return moved;
}

// Writes what waits in `peer`'s channel and settles the ops whose frames went (B); times out
// a send the peer took no byte of for HVD_TIMEOUT.
Status PeerOps::flushPeer(int peer, Clock::time_point now, bool* wrote) {
  transport::PeerChannel& channel = *mesh_.peerChannel(peer);
  PerPeer& p = peers_[peer];
  sent_.clear();
  if (channel.hasBacklog()) HVD_RETURN_IF_ERROR(channel.flush(&sent_, wrote));
  for (size_t k = 0; k < sent_.size(); ++k) {  // frames are written in queue order (B)
    if (sent_[k] == kReceiptId) {
      p.receipts.pop_front();
      continue;
    }
    if (sent_[k] == kResendId) {
      p.resends.pop_front();
      continue;
    }
    if (sent_[k] == kRefusalId) {
      p.refusals.pop_front();
      continue;
    }
    Op& op = p.sending.front();
    HVD_CHECK_EQ(sent_[k], static_cast<uint64_t>(op.handle));
    if (op.device >= 0 && !op.copied) {
      p.staged.push_back(std::move(op));  // completes when its copy finished
    } else {
      completeSend(op);
    }
    p.sending.pop_front();
  }
  if (*wrote) {
    for (Op& op : p.sending) op.since = now;
  } else if (!p.sending.empty() && now - p.sending.front().since > timeout_) {
    return common::timedOut(what("send", peer, p.sending.front().tag) + ": the peer took no "
                            "byte for " + seconds(timeout_.count()) +
                            " s (HVD_TIMEOUT): it is stopped, stuck, or not reading");
  }
  return Status::ok();
}

Status PeerOps::progressPeer(int peer, Clock::time_point now, bool* moved) {
  transport::PeerChannel& channel = *mesh_.peerChannel(peer);
  PerPeer& p = peers_[peer];
  const bool read_early = read_early_[peer] != 0;
  read_early_[peer] = 0;
  // Nothing to write, read or time out with this peer: every pass of a host's small
  // collectives (Note [One round]) comes here for each peer.
  // Note [One round] K; Note [Caller drives] D: a driving caller reads what nobody watches
  const bool unwatched = caller_drives_ && !sockets_watched_.load();
  const bool board = (board_waiting_ || unwatched) && !channel.onSharedMemory();
  if (readable_[peer] == 0 && p.sending.empty() && p.receiving.empty() && p.reading.empty() &&
      !channel.hasBacklog() && !channel.hasIncoming() && !board) {
    return Status::ok();
  }
  bool wrote = false, read = false;
  HVD_RETURN_IF_ERROR(flushPeer(peer, now, &wrote));
  // A ring is read whenever it has bytes (Note [Point-to-point over shm] A); a socket when it
  // polled readable or a receive waits on it (unless takeSubmitted just read it).
  if (readable_[peer] != 0 || channel.hasIncoming() || board ||
      (!p.receiving.empty() && !channel.onSharedMemory() && !read_early)) {
    HVD_RETURN_IF_ERROR(readPeer(peer, now, &read));
  }
  // Note [Refused messages] A: a refusal a match queued goes now, not on the next pass
  if (!p.refusals.empty()) HVD_RETURN_IF_ERROR(flushPeer(peer, now, &wrote));
  timeOut(p, now);
  *moved = *moved || wrote || read || !sent_.empty();
  return Status::ok();
}

void PeerOps::sendBoard(int peer, transport::PeerFrameKind kind, int64_t tag,
                        std::string payload) {
  if (!open(peer)) return;  // its connection failed while shutting down (F)
  PerPeer& p = peers_[peer];
  p.receipts.push_back(std::move(payload));  // written in order, popped by kReceiptId
  transport::PeerFrame frame;
  frame.kind = kind;
  frame.tag = tag;
  frame.bytes = p.receipts.back().size();
  mesh_.peerChannel(peer)->send(frame, p.receipts.back().data(), kReceiptId);
  bool wrote = false;  // a failed write is the next pass's to report
  (void)flushPeer(peer, Clock::now(), &wrote);
}

Status PeerOps::readPeer(int peer, Clock::time_point now, bool* read) {
  transport::PeerChannel& channel = *mesh_.peerChannel(peer);
  PerPeer& p = peers_[peer];
  received_.clear();
  const bool socket_readable = readable_[peer] != 0;
  readable_[peer] = 0;
  const Status received = channel.receive(&received_, read, socket_readable);
  // Messages completed before an error (a peer that sent, then exited) are kept first, so
  // failAll frees them.
  Status stored = Status::ok();
  for (transport::PeerMessage& m : received_) {
    stored = arrive(peer, p, std::move(m));
    if (!stored.isOk()) break;
  }
  const bool arrived = !received_.empty();
  received_.clear();  // bindOrAllocate counts what it holds (Note [Receive into out] A)
  const transport::PeerChannel::SplitCounts split = channel.takeSplitCounts();
  metrics_.countP2pSplit(split.sent, split.received, split.refused);
  HVD_RETURN_IF_ERROR(stored);
  HVD_RETURN_IF_ERROR(received);
  if (*read) {  // the peer is alive and moving: a split send waits for its answers meanwhile
    for (Op& op : p.receiving) op.since = now;
    for (Op& op : p.sending) op.since = now;
  }
  if (arrived) match(p);
  if (!p.refused.isOk()) settleRefusal(p);  // Note [Refused messages] B
  return Status::ok();
}

// A receipt's payload is the peer's; a malformed device message fails the rank as a
// malformed header does (the peer is not this job's code, or memory is corrupt).
Status PeerOps::arrive(int peer, PerPeer& p, transport::PeerMessage message) {
  const transport::PeerFrame& frame = message.frame;
  if (frame.kind == transport::PeerFrameKind::kDeviceRead ||
      frame.kind == transport::PeerFrameKind::kDeviceRefused) {
    uint64_t sequence = 0;
    HVD_RETURN_IF_ERROR(
        transport::decodeDeviceRead(message.payload.data, frame.bytes, &sequence));
    if (frame.kind == transport::PeerFrameKind::kDeviceRefused) return refused(peer, sequence);
    device_.released(peer, sequence);
    return Status::ok();
  }
  if (frame.kind == transport::PeerFrameKind::kDeviceResend) return resent(p, std::move(message));
  if (frame.kind == transport::PeerFrameKind::kRefused) return refusedBy(peer, p, message);
  if (frame.kind == transport::PeerFrameKind::kBoardPost ||
      frame.kind == transport::PeerFrameKind::kBoardState) {  // Note [One round] K
    if (!board_sink_) return common::internalError("a one-round frame with no board here");
    return board_sink_(peer, message);
  }
  if (frame.kind == transport::PeerFrameKind::kNcclId ||
      frame.kind == transport::PeerFrameKind::kDeviceNccl) {
    return arriveNccl(peer, p, std::move(message));
  }
  Arrived arrived{frame.tag, {}, {}, 0, nullptr, p.arrived_messages++};
  if (frame.kind == transport::PeerFrameKind::kDevice) {
    uint64_t tensor_bytes = 0;
    transport::peerPayloadBytes(frame.dtype, frame.shape, &tensor_bytes);
    HVD_RETURN_IF_ERROR(transport::decodeDeviceMessage(message.payload.data, frame.bytes,
                                                       tensor_bytes, &arrived.device));
  }
  arrived.message = std::move(message);  // before dropArrival, which reads its kind
  if (shutting_down_) {
    dropArrival(peer, arrived);
    return Status::ok();
  }
  p.arrived.push_back(std::move(arrived));
  return Status::ok();
}

// B: every posted receive takes the first arrived message with its tag.
void PeerOps::match(PerPeer& p) {
  for (auto r = p.receiving.begin(); r != p.receiving.end();) {
    auto m = p.arrived.begin();
    while (m != p.arrived.end() && m->tag != r->tag) ++m;
    if (m == p.arrived.end()) {
      ++r;
      continue;
    }
    const transport::PeerPayload& payload = m->message.payload;
    if (r->expects) refuseIfUnfit(*r, *m);  // Note [Refused messages] A
    if (m->message.frame.kind == transport::PeerFrameKind::kDevice) {
      HVD_CHECK(!r->bound);  // Note [Receive into out] A: host messages only
      startDeviceRead(p, std::move(*r), std::move(*m));
    } else if (m->message.frame.kind == transport::PeerFrameKind::kDeviceNccl) {
      HVD_CHECK(!r->bound);
      startNcclRead(p, std::move(*r), *m);
    } else {
      // Note [Receive into out] B: a bound receive gets the bytes in its `into`; any other one
      // bytes in memory of their own (not another receive's `into`)
      HVD_CHECK(r->bound ? payload.data == r->into
                         : payload.owner != nullptr || payload.data == nullptr);
      transport::PeerMessage& message = m->message;
      // A bound receive gets no buffer: the message is in its own `into` (Note [Receive into
      // out] B).
      completeReceive(*r, std::static_pointer_cast<OutputBuffer>(
                              std::move(message.payload.owner)),
                      std::move(message.frame.shape), message.frame.dtype);
    }
    p.arrived.erase(m);
    r = p.receiving.erase(r);
  }
}

void PeerOps::completeSend(const Op& op) {
  if (!op.refusal.isOk()) {  // Note [Refused messages] B: its tensor is free now
    fail(op, op.refusal);
    return;
  }
  uint64_t bytes = 0;
  transport::peerPayloadBytes(op.dtype, op.shape, &bytes);
  metrics_.countP2p(/*sent=*/true, bytes);
  endSpan(op);
  handles_.complete(op.handle, Status::ok());
}

void PeerOps::fail(const Op& op, const Status& status) {
  endSpan(op, status);
  handles_.complete(op.handle, status);
}

// Spans are named like the pending list's entries ("send to rank 1, tag 5"), one track per
// (peer, tag) and direction; the name is built only while a timeline records.
void PeerOps::startSpan(Op& op) {
  if (timeline_ == nullptr || !timeline_->enabled()) return;
  op.span = what(op.is_send ? "send" : "recv", op.peer, op.tag);
  if (op.is_send) {
    timeline_->start(op.span, "SEND", op.dtype, op.shape);
  } else {
    timeline_->startUntyped(op.span, "RECV");
  }
}

void PeerOps::endSpan(const Op& op, const Status& status) {
  if (op.span.empty()) return;
  timeline_->end(op.span, status.isOk() ? std::string_view() : status.message());
}

bool PeerOps::idle() const {
  if (device_.busy() || nccl_.busy()) return false;
  for (const PerPeer& p : peers_) {
    if (!p.sending.empty() || !p.receiving.empty() || !p.staged.empty() || !p.reading.empty() ||
        !p.receipts.empty() || !p.resends.empty() || !p.refusals.empty()) {
      return false;
    }
  }
  // A message in a ring that no pass has read yet (Note [Point-to-point over shm] C).
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
    if (open(peer) && mesh_.peerChannel(peer)->hasIncoming()) return false;
  }
  std::lock_guard<std::mutex> lock(mutex_);
  return submitted_.empty();
}

void PeerOps::appendPending(Clock::time_point now, std::vector<PendingInfo>* out) const {
  for (const PerPeer& p : peers_) {
    for (const auto* ops : {&p.receiving, &p.reading, &p.sending, &p.staged}) {
      for (const Op& op : *ops) {
        PendingInfo info;
        info.op = op.is_send ? "SEND" : "RECV";
        info.name = std::string(op.is_send ? "to" : "from") + " rank " +
                    std::to_string(op.peer) + ", tag " + std::to_string(op.tag);
        info.age_seconds = std::chrono::duration<double>(now - op.since).count();
        info.missing_ranks = {op.peer};
        out->push_back(std::move(info));
      }
    }
  }
}

void PeerOps::pollSet(std::vector<int>* fds, std::vector<short>* events,
                      std::vector<int>* peers) const {
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
    if (!open(peer)) continue;  // F: a closed socket would poll readable for ever
    const transport::PeerChannel* channel = mesh_.peerChannel(peer);
    fds->push_back(channel->fd());
    events->push_back(static_cast<short>(POLLIN | (channel->wantsWritable() ? POLLOUT : 0)));
    peers->push_back(peer);
  }
}

bool PeerOps::announceSleep() {
  transport::shm::Doorbell* bell = mesh_.peerDoorbell();
  if (bell == nullptr) return false;
  transport::shm::beginPollSleep(bell);  // Note [Point-to-point over shm] B
  return ringsCanMove();
}

// After a sleep was announced or a `driving` mark cleared (seq_cst): a ring with bytes to
// read, or room for a backlog (rearmWriter leaves the mark its reader answers with a wake),
// means: do not sleep, or leave the reading to nobody.
bool PeerOps::ringsCanMove() {
  bool ready = false;
  for (int peer = 0; peer < static_cast<int>(peers_.size()); ++peer) {
    transport::PeerChannel* channel = mesh_.peerChannel(peer);
    if (!open(peer) || !channel->onSharedMemory()) continue;
    ready = channel->hasIncoming() || channel->rearmWriter() || ready;
  }
  return ready;
}

void PeerOps::endSleep() {
  if (transport::shm::Doorbell* bell = mesh_.peerDoorbell()) transport::shm::endSleep(bell);
}

void PeerOps::setDriving(bool driving) {
  caller_drives_ = driving;
  markDoorbell(transport::shm::kCallerDrives, driving);  // C
}

transport::shm::Doorbell* PeerOps::announceCallerSleep(uint32_t* seen) {
  transport::shm::Doorbell* bell = mesh_.peerDoorbell();
  if (bell == nullptr) return nullptr;
  *seen = bell->sequence.load(std::memory_order_seq_cst);  // G: before the announcement
  transport::shm::markDriving(bell, transport::shm::kCallerSleeps, true);
  return ringsCanMove() ? nullptr : bell;
}

void PeerOps::endCallerSleep() { markDoorbell(transport::shm::kCallerSleeps, false); }

// Under progress_, which close() runs under too: no doorbell_mutex on the drive path.
void PeerOps::markDoorbell(uint32_t bit, bool on) {
  if (transport::shm::Doorbell* bell = mesh_.peerDoorbell()) {
    transport::shm::markDriving(bell, bit, on);
  }
}


// Note [Point-to-point over shm] B: a peer's message wakes this rank's sleeping loop only while
// a receive is open (submitted, not completed); the count lives in the peer doorbell.
void PeerOps::listen(int delta) {
  if (transport::shm::Doorbell* bell = mesh_.peerDoorbell()) {
    bell->listening.fetch_add(static_cast<uint32_t>(delta), std::memory_order_seq_cst);
  }
}

}  // namespace hvd::runtime
