// The split copy of a large point-to-point message (transport/peer_channel.h).
//
// Note [Split copy]
// Through the ring (Note [Point-to-point over shm] E) every byte is copied twice, once by each
// side, in pieces that overlap: a message moves at the speed of one copy (16 MiB in 1.30 ms
// here, MPICH's 1.27 ms: both bound by the receiver's copy). Between ranks of one host each
// side can instead copy half of the message straight from the sender's tensor into the
// receiver's memory (process_vm_readv / process_vm_writev): every byte is copied once, and the
// two halves at once, on two cores (a scratch test: 16 MiB in 0.84 ms).
//   A. The sender of a host message of at least HVD_P2P_SPLIT_MIN_BYTES writes a kSplitOffer
//      in its place: the message's tag, dtype and shape, its pid and the tensor's address. No
//      frame passes it: the channel writes nothing else of the outbox until the message is
//      done (answers, C, excepted), so messages still arrive in the order they were sent.
//   B. The receiver takes the offer when it reads it, as it takes any message (Note
//      [Point-to-point] B: sends never wait for a receive): memory from the channel's
//      allocator (a posted receive's out= when it fits, Note [Receive into out] A), then a
//      kSplitAccept naming that memory; it reads [0, half) of the sender's bytes, a piece per
//      pass. The sender, given the accept, writes [half, bytes) into the receiver's memory, a
//      piece per pass, then sends kSplitDone. Once the receiver has read its half and seen
//      Done it has the message, and sends kSplitRead; the send completes when that arrives
//      (its tensor is read until then, Note [Point-to-point] C).
//   C. Answers (accept, done, read) are written ahead of the outbox whenever no frame is half
//      written, and they and offers wake a sleeping peer whatever the ring's wake rule (an
//      offer's receiver may have no receive open, Note [Point-to-point over shm] B): each side
//      waits for the other's answer, and two ranks sending each other split messages would
//      otherwise wait for ever behind their own offers.
//   D. Whom a pid names is checked once per channel, before the first copy: the endpoint
//      carries the address and value of its process's identity word (random, per process),
//      which the other side reads with process_vm_readv; every later endpoint must name that
//      same process and word. A pid of another PID namespace, a recycled pid or a kernel that
//      refuses (EPERM: Yama, seccomp) fails the check, and nothing is ever written to an
//      unverified process. A receiver that cannot verify refuses (an accept with address and
//      identity 0): the sender sends that message, every queued offer and every later message
//      whole through the ring. A sender that cannot verify the receiver writes nothing and
//      says so (Done 0): the receiver reads the whole message itself.
//   E. A ring is copied a piece (kSplitPieceBytes) per pass on each side, so a pass stays short
//      and other channels move between pieces; hasIncoming() and rearmWriter() report a
//      pending piece, so neither side sleeps while it has one, and both sleep while they wait
//      for the other's answer (C wakes them).
//   F. Only memory the core owns is ever written by the peer. A sender cannot be stopped once
//      it writes: had the user's out= been the target, a receive that timed out (or a rank
//      that failed) could return while a stopped sender, resumed, wrote into memory the user
//      had freed and reused. So an offer whose message a posted receive's out= would take
//      (Note [Receive into out] A) is read by this side alone from kHelperMinBytes (G), and
//      below that answered "send it whole" (address 0, identity set): the message comes
//      through the ring into out, and only then are later messages offered again. A receive
//      that ends while its out= waits for that whole message hands the memory back
//      (rehomeIncoming: nothing was written there). A receiving channel destroyed before its
//      sender said Done never frees the core memory it gave (it may still be written). A
//      failed send's tensor may be read by the receiver after the failure (the peer's message
//      is then garbage, and its rank fails with this one's).
//   G. From kHelperMinBytes such an offer is answered kSplitReadAll: the sender writes nothing
//      and waits for kSplitRead. The driving thread reads [0, half) a piece per pass, as in B
//      but of kReadAllPieceBytes (fewer calls: 32 MiB in 1 MiB pieces took 8.7 ms here, in
//      4 MiB pieces or one call 6.4), while the process's helper thread
//      (transport/shm/helper_read.h) reads [half, bytes) at once: two cores copy, as in B,
//      into memory only this process writes (benchmarks/profile_p2p.py --out, one way, median
//      of 40: 4 MiB 0.53 ms against 0.59 through the ring, 64 MiB 8.0-8.7 against 10.2-10.4).
//      Below kHelperMinBytes the ring is as fast: the sender, idle until the Read, sleeps, and
//      its wake costs what the second copy saves. The helper's end wakes the rank
//      (setHelperWake: a caller asleep on the doorbell, and the loop), whose next pass
//      completes the message; the rank may sleep while only the helper reads. What ends the
//      receive early (rehomeIncoming: the rest goes on in memory of the core's) and the
//      channel's end first wait for the helper's read, which is bounded (a stopped sender's
//      memory is read all the same, an exited one's fails): once the receive has returned,
//      nothing writes its out= again.
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <random>

#include "common/byte_codec.h"
#include "common/test_switch.h"
#include "transport/peer_channel.h"
#include "transport/shm/cross_memory.h"

namespace hvd::transport {

using common::Status;

namespace {

constexpr uint64_t kSplitPieceBytes = 1 << 20;  // E
constexpr uint64_t kHelperMinBytes = 4 << 20;   // G
constexpr uint64_t kReadAllPieceBytes = 4 << 20;  // G

// D: this process's identity word; read by peers, never written after it is drawn.
const volatile uint64_t* identityWord() {
  static const volatile uint64_t word = [] {
    std::random_device device;
    uint64_t value = (static_cast<uint64_t>(device()) << 32) ^ device();
    return value == 0 ? 1 : value;
  }();
  return &word;
}

SplitEndpoint self(uint64_t address) {
  SplitEndpoint endpoint;
  endpoint.pid = static_cast<uint64_t>(::getpid());
  endpoint.address = address;
  endpoint.identity_address = reinterpret_cast<uint64_t>(identityWord());
  endpoint.identity_value = *identityWord();
  return endpoint;
}

bool testSwitchOn(const char* raw) { return raw != nullptr && std::strcmp(raw, "1") == 0; }

// A copy straight between the two processes failed (B, G). A peer that is gone (ESRCH) or
// whose memory went (EFAULT: a failed sender's tensor freed, F) is a lost peer: its own
// failure may still come to name the cause (Note [Failure fan-out]). A refusal (EPERM) or a
// forked child's inherited read fails this rank at once.
Status copyFailed(int peer, const Status& why, int os_error) {
  std::string what = "point-to-point connection to rank " + std::to_string(peer) +
                     ": split copy failed: " + why.message();
  return os_error == ESRCH || os_error == EFAULT ? common::peerLost(std::move(what))
                                                 : common::internalError(std::move(what));
}

Status malformed(int peer, const std::string& what) {
  return common::internalError("malformed split copy from rank " + std::to_string(peer) + ": " +
                               what);
}

}  // namespace

PeerChannel::SplitCounts PeerChannel::takeSplitCounts() {
  const SplitCounts counts = split_counts_;
  split_counts_ = SplitCounts();
  return counts;
}

bool PeerChannel::splitEligible(const PeerFrame& frame) const {
  return link_ != nullptr && split_min_bytes_ > 0 && !split_refused_ &&
         frame.kind == PeerFrameKind::kHost && frame.bytes > 0 &&
         frame.bytes >= split_min_bytes_;
}

void PeerChannel::offer(Outgoing* o) {  // A
  PeerFrame offer = o->frame;
  offer.kind = PeerFrameKind::kSplitOffer;
  offer.bytes = kSplitEndpointBytes;
  o->header = encodePeerHeader(offer) + encodeSplitEndpoint(self(reinterpret_cast<uint64_t>(
                                            o->tensor)));
  o->payload = nullptr;
  o->bytes = 0;
  o->split = Split::kOffer;
}

bool PeerChannel::rearmWriter() {  // E
  if (link_ == nullptr) return false;
  const Split split = outbox_.empty() ? Split::kNone : outbox_.front().split;
  if (split == Split::kWriting || split == Split::kDone) return true;  // its own work
  // Frames to write (not a split head waiting for the peer's answer, which wakes this rank:
  // C), or answers: the ring's room decides.
  const bool frames = !outbox_.empty() && split != Split::kAwaitAccept &&
                      split != Split::kAwaitRead && !paused();
  return (frames || !control_.empty()) && link_->rearm();
}

void PeerChannel::dropOutbox() {
  outbox_.clear();
  control_.clear();
  control_written_ = 0;
}

void PeerChannel::queueControl(PeerFrameKind kind, const std::string& payload) {
  PeerFrame frame;
  frame.kind = kind;
  frame.bytes = payload.size();
  control_.push_back(encodePeerHeader(frame) + payload);
}

Status PeerChannel::writeControl(bool* moved) {  // C
  if (control_.empty() || link_ == nullptr) return Status::ok();
  if (!outbox_.empty()) {
    const Outgoing& head = outbox_.front();
    const bool mid_frame = head.written > 0 && head.written < head.header.size() + head.bytes;
    if (mid_frame && head.split <= Split::kOffer) return Status::ok();
  }
  while (!control_.empty()) {
    const std::string& frame = control_.front();
    iovec piece{const_cast<char*>(frame.data()) + control_written_,
                frame.size() - control_written_};
    const size_t wrote = link_->writeGather(&piece, 1, /*always_wake=*/true);
    if (wrote == 0) return Status::ok();
    *moved = true;
    control_written_ += wrote;
    if (control_written_ < frame.size()) return Status::ok();
    control_.pop_front();
    control_written_ = 0;
  }
  return Status::ok();
}

Status PeerChannel::handleControl(const PeerFrame& frame, const uint8_t* payload) {
  if (link_ == nullptr) return malformed(peer_, "a split frame over TCP");
  if (frame.kind == PeerFrameKind::kSplitOffer || frame.kind == PeerFrameKind::kSplitAccept) {
    SplitEndpoint endpoint;
    Status s = decodeSplitEndpoint(payload, frame.bytes, &endpoint);
    if (!s.isOk()) return malformed(peer_, s.message());
    return frame.kind == PeerFrameKind::kSplitOffer ? takeOffer(frame, endpoint)
                                                    : takeAccept(endpoint);
  }
  if (frame.kind == PeerFrameKind::kSplitReadAll) {  // G
    if (outbox_.empty() || outbox_.front().split != Split::kAwaitAccept) {
      return malformed(peer_, "a read-all without an offer");
    }
    outbox_.front().split = Split::kAwaitRead;
    return Status::ok();
  }
  if (frame.kind == PeerFrameKind::kSplitDone) {
    common::ByteReader in(payload, frame.bytes);
    uint64_t wrote = 0;
    in.u64(&wrote);
    if (!split_in_.active || split_in_.sender_done || wrote > 1) {
      return malformed(peer_, "a done without a split message");
    }
    split_in_.sender_done = true;
    if (wrote == 0) split_in_.end = split_in_.message.frame.bytes;  // D: read it all
    return Status::ok();
  }
  // kSplitRead
  if (outbox_.empty() || (outbox_.front().split != Split::kWriting &&
                          outbox_.front().split != Split::kAwaitRead)) {
    return malformed(peer_, "a read receipt without a split message");
  }
  if (outbox_.front().split == Split::kWriting) return malformed(peer_, "a receipt too early");
  outbox_.front().split = Split::kDone;
  ++split_counts_.sent;
  return Status::ok();
}

// D: once per channel; a refused or failed read, or another value, is "no". Every later
// endpoint must name the same process and word: a peer cannot get one verified and then send
// this rank's writes elsewhere.
bool PeerChannel::verified(const SplitEndpoint& peer) {
  if (peer_identity_ == 0) {
    uint64_t value = 0;
    const bool forced = testSwitchOn(HVD_TEST_SWITCH("P2P_SPLIT_UNVERIFIED"));
    const bool read = !forced && shm::readPeer(static_cast<pid_t>(peer.pid),
                                               peer.identity_address, &value,
                                               sizeof(value)).isOk();
    peer_identity_ = read && value == peer.identity_value ? 1 : -1;
    verified_ = peer;
  }
  return peer_identity_ == 1 && peer.pid == verified_.pid &&
         peer.identity_address == verified_.identity_address &&
         peer.identity_value == verified_.identity_value;
}

Status PeerChannel::takeOffer(const PeerFrame& offer, const SplitEndpoint& sender) {  // B
  if (split_in_.active || whole_.data != nullptr) {
    return malformed(peer_, "an offer while another message is open");
  }
  PeerFrame frame = offer;
  frame.kind = PeerFrameKind::kHost;
  peerPayloadBytes(frame.dtype, frame.shape, &frame.bytes);  // checked by decodePeerHeader
  if (split_min_bytes_ == 0 || !verified(sender)) {  // D: this one and every later one whole
    ++split_counts_.refused;
    SplitEndpoint never = self(0);
    never.identity_address = never.identity_value = 0;
    queueControl(PeerFrameKind::kSplitAccept, encodeSplitEndpoint(never));
    return Status::ok();
  }
  PeerPayload payload = allocate_(allocate_context_, peer_, frame);
  if (payload.data == nullptr) {
    return outOfMemory(frame.bytes, "a");
  }
  if (payload.owner == nullptr) {  // F: a posted receive's out=: only this process writes it
    if (frame.bytes >= kHelperMinBytes) {
      readAll(std::move(frame), std::move(payload), sender);  // G
      return Status::ok();
    }
    ++split_counts_.refused;
    whole_ = std::move(payload);   // startPayload takes it for the whole message that follows
    whole_frame_ = std::move(frame);
    queueControl(PeerFrameKind::kSplitAccept, encodeSplitEndpoint(self(0)));
    return Status::ok();
  }
  split_in_ = IncomingSplit();
  split_in_.active = true;
  split_in_.sender = sender;
  split_in_.end = shm::pageHalf(frame.bytes);
  split_in_.message = PeerMessage{std::move(frame), std::move(payload)};
  queueControl(PeerFrameKind::kSplitAccept,
               encodeSplitEndpoint(self(reinterpret_cast<uint64_t>(
                   split_in_.message.payload.data))));
  return Status::ok();
}

// D: every queued offer not begun goes whole; so does every later message.
void PeerChannel::stopOffering() {
  split_refused_ = true;
  for (Outgoing& o : outbox_) {
    if (o.split == Split::kOffer && o.written == 0) sendWhole(&o);
  }
}

void PeerChannel::sendWhole(Outgoing* o) {
  o->header = encodePeerHeader(o->frame);
  o->payload = o->tensor;
  o->bytes = o->frame.bytes;
  o->written = 0;
  o->split = Split::kNone;
}

Status PeerChannel::takeAccept(const SplitEndpoint& receiver) {
  if (outbox_.empty() || outbox_.front().split != Split::kAwaitAccept) {
    return malformed(peer_, "an accept without an offer");
  }
  Outgoing& o = outbox_.front();
  if (receiver.address == 0) {  // D, F: this one whole; with no identity, every later one too
    ++split_counts_.refused;
    sendWhole(&o);
    if (receiver.identity_address == 0) stopOffering();
    return Status::ok();
  }
  if (!verified(receiver)) {  // D: the receiver reads it all
    stopOffering();
    o.split = Split::kAwaitRead;
    std::string done;
    common::ByteWriter(&done).u64(0);
    queueControl(PeerFrameKind::kSplitDone, done);
    return Status::ok();
  }
  o.receiver = receiver;
  o.half_written = shm::pageHalf(o.frame.bytes);
  o.split = Split::kWriting;
  return Status::ok();
}

Status PeerChannel::writeHalf(Outgoing* o, bool* moved) {  // B, E
  const uint64_t bytes = o->frame.bytes;
  const uint64_t piece = std::min(kSplitPieceBytes, bytes - o->half_written);
  if (piece > 0) {
    int os_error = 0;
    Status s = shm::writePeer(static_cast<pid_t>(o->receiver.pid), o->receiver.address +
                         o->half_written, o->tensor + o->half_written, piece, &os_error);
    if (!s.isOk()) {
      return copyFailed(peer_, s, os_error);
    }
    o->half_written += piece;
    *moved = true;
  }
  if (o->half_written == bytes) {
    o->split = Split::kAwaitRead;
    std::string done;
    common::ByteWriter(&done).u64(1);
    queueControl(PeerFrameKind::kSplitDone, done);
  }
  return Status::ok();
}

Status PeerChannel::readHalf(bool* moved) {  // B, E
  IncomingSplit& in = split_in_;
  if (in.got < in.end) {
    const uint64_t most = in.helper != nullptr ? kReadAllPieceBytes : kSplitPieceBytes;  // E, G
    const uint64_t piece = std::min(most, in.end - in.got);
    int os_error = 0;
    Status s = shm::readPeer(static_cast<pid_t>(in.sender.pid), in.sender.address + in.got,
                        in.message.payload.data + in.got, piece, &os_error);
    if (!s.isOk()) {
      return copyFailed(peer_, s, os_error);
    }
    in.got += piece;
    *moved = true;
  }
  return Status::ok();
}

Status PeerChannel::completeSplit(std::vector<PeerMessage>* out) {
  IncomingSplit& in = split_in_;
  if (!in.active || in.got < in.end || !in.sender_done) return Status::ok();
  if (in.helper != nullptr) {  // G
    if (!in.helper->finished.load(std::memory_order_seq_cst)) return Status::ok();  // it wakes
    shm::awaitHelperRead(*in.helper);  // (its wake is being rung: moments)
    if (!in.helper->status.isOk()) {
      return copyFailed(peer_, in.helper->status, in.helper->os_error);
    }
  }
  queueControl(PeerFrameKind::kSplitRead, std::string());
  ++split_counts_.received;
  out->push_back(std::move(in.message));
  in = IncomingSplit();
  return Status::ok();
}

void PeerChannel::readAll(PeerFrame frame, PeerPayload out, const SplitEndpoint& sender) {  // G
  const uint64_t bytes = frame.bytes;
  split_in_ = IncomingSplit();
  split_in_.active = true;
  split_in_.sender = sender;
  split_in_.sender_done = true;  // it writes nothing
  split_in_.end = shm::pageHalf(bytes);
  split_in_.message = PeerMessage{std::move(frame), std::move(out)};
  auto read = std::make_shared<shm::HelperRead>();
  read->pid = static_cast<pid_t>(sender.pid);
  read->remote = sender.address + split_in_.end;
  read->local = split_in_.message.payload.data + split_in_.end;
  read->bytes = static_cast<size_t>(bytes - split_in_.end);
  read->on_finished = helper_wake_;
  read->context = helper_wake_context_;
  split_in_.helper = read;
  shm::startHelperRead(std::move(read));  // the sender's bytes stay until its Read
  queueControl(PeerFrameKind::kSplitReadAll, std::string());
}

// G: the receive whose out= a read-all fills ended first. False when `data` is not that out=.
bool PeerChannel::rehomeReadAll(const uint8_t* data) {
  IncomingSplit& in = split_in_;
  if (!in.active || in.message.payload.owner != nullptr || in.message.payload.data != data) {
    return false;
  }
  settleHelperRead();
  PeerPayload fresh = allocate_(allocate_context_, peer_, in.message.frame);
  if (fresh.data == nullptr) {
    broken_ = outOfMemory(in.message.frame.bytes, "the rest of a");
    return true;
  }
  const uint64_t bytes = in.message.frame.bytes;
  std::memcpy(fresh.data, data, static_cast<size_t>(in.got));
  if (in.helper != nullptr && in.helper->status.isOk()) {  // (a failure: completeSplit's)
    std::memcpy(fresh.data + in.end, data + in.end, static_cast<size_t>(bytes - in.end));
  }
  in.message.payload = std::move(fresh);
  return true;
}

void PeerChannel::settleHelperRead() {
  if (split_in_.helper != nullptr) shm::awaitHelperRead(*split_in_.helper);
}

void PeerChannel::keepForever(std::shared_ptr<void> owner) {  // F
  if (owner != nullptr) new std::shared_ptr<void>(std::move(owner));  // never deleted
}

}  // namespace hvd::transport
