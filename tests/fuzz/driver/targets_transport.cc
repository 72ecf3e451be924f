// The transport's decoders of a peer's bytes, each run through its public entry point on a
// socket fed with the input (FedSocket): the mesh handshake, both ends (tcp/handshake.h), the
// control frames (transport/control.h) and the point-to-point frames
// (transport/peer_channel.h); the shared-memory setups are in targets_shm_setup.cc. Every
// input ends in EOF, so a kTimeout means a decoder waited for bytes that can never come: a
// failure, as is any status code the entry point does not give (status_outcome.h).
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/byte_codec.h"
#include "fuzz.h"
#include "status_outcome.h"
#include "transport/control.h"
#include "transport/peer_channel.h"
#include "transport/shm/ring_stream.h"
#include "transport/shm/segment.h"
#include "transport/tcp/handshake.h"

namespace hvd::fuzz {

FedSocket::FedSocket() {
  int pair[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
    std::perror("socketpair");
    std::abort();
  }
  fd_ = pair[0];
  peer_ = pair[1];
  const int bytes = 1 << 20;  // well above kMaxInputBytes, whatever the system's default
  ::setsockopt(peer_, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
}

FedSocket::~FedSocket() {
  if (fd_ >= 0) ::close(fd_);
  ::close(peer_);
}

void FedSocket::feed(const std::string& bytes) {
  for (size_t done = 0; done < bytes.size();) {  // an input fits the socket buffer: no wait
    const ssize_t n = ::send(peer_, bytes.data() + done, bytes.size() - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      std::perror("feeding the decoder's socket");
      std::abort();
    }
    done += static_cast<size_t>(n);
  }
}

void FedSocket::hangUp() { ::shutdown(peer_, SHUT_WR); }

std::string FedSocket::written() {
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::recv(peer_, buf, sizeof(buf), MSG_DONTWAIT)) > 0) out.append(buf, n);
  return out;
}

namespace {

using common::Code;
using common::Status;

const transport::tcp::JobIdentity kSelf{"secret of the job", "job-7", 1, 4};

constexpr uint32_t kHelloMagic = 0x48445648, kChallengeMagic = 0x41445648;
constexpr uint32_t kWelcomeMagic = 0x4b445648;


// Acceptor: the input is what a dialer sends (hello, job id, proof). Nobody here knows the
// nonce the acceptor draws, so a proof never verifies: "accepted" counts the inputs whose
// hello was decoded and admitted (rejected at the proof), and an OK would be a forged entry.
Outcome handshakeAcceptor(const std::string& input) {
  FedSocket sock(input);
  int rank = -1;
  transport::tcp::ChannelKind kind;
  auto admit = [](int r, transport::tcp::ChannelKind) {
    return r == 3 ? std::string("rank 3 is already connected") : std::string();
  };
  const Status s = transport::tcp::acceptorHandshake(sock.fd(), kSelf, admit, soon(), &rank, &kind);
  if (s.isOk()) return failed("a dialer without the secret was accepted");
  if (s.message() == "authentication failed (wrong secret)") return accepted();
  const bool expected = s.code() == Code::kInternal || s.code() == Code::kInvalidArgument ||
                        s.code() == Code::kPeerLost;
  return expected ? rejected() : unexpected(s);
}

std::vector<std::string> helloSeeds(Rng& rng) {
  std::vector<std::string> seeds;
  for (int i = 0; i < 16; ++i) {
    std::string s;
    common::ByteWriter w(&s);
    const std::string job = rng.chance(4) ? "job-8" : kSelf.job_id;
    w.u32(kHelloMagic);
    w.u16(1);
    w.u8(static_cast<uint8_t>(1 + rng.below(2)));
    w.u8(static_cast<uint8_t>(job.size()));
    w.i32(static_cast<int32_t>(rng.below(5)));
    w.i32(rng.chance(4) ? 0 : kSelf.rank);
    s += rng.bytes(32);  // nonce
    s += job;
    s += rng.bytes(32);  // proof
    seeds.push_back(s);
  }
  return seeds;
}

// Dialer: the input is the acceptor's challenge and welcome. The dialer's nonce is fresh, so
// no challenge verifies: every input must be refused, none may connect.
Outcome handshakeDialer(const std::string& input) {
  FedSocket sock(input);
  const Status s = transport::tcp::dialerHandshake(sock.fd(), kSelf, 0,
                                                   transport::tcp::ChannelKind::kControl, soon());
  if (s.isOk()) return failed("connected to a listener that does not know the secret");
  return refused(s);
}

std::vector<std::string> challengeSeeds(Rng& rng) {
  std::vector<std::string> seeds;
  for (int i = 0; i < 8; ++i) {
    std::string s;
    common::ByteWriter w(&s);
    w.u32(kChallengeMagic);
    s += rng.bytes(64);  // nonce, mac
    w.u32(kWelcomeMagic);
    seeds.push_back(s);
  }
  return seeds;
}

// Control frames: fed in up to three pieces (a frame may arrive split), received after each,
// then the hang-up. The frames received, framed again, must be a prefix of the input; the
// channel ends in kPeerLost (the hang-up) or kInternal (a malformed frame).
Outcome controlFrames(const std::string& input) {
  FedSocket sock;
  transport::ControlChannel channel(::dup(sock.fd()), 1);
  std::vector<transport::ControlMessage> frames;
  const size_t cuts[] = {input.size() / 3, input.size() * 2 / 3, input.size()};
  size_t fed = 0;
  Status s;
  for (size_t cut : cuts) {
    sock.feed(input.substr(fed, cut - fed));
    fed = cut;
    s = channel.receive(&frames);
    if (!s.isOk()) break;
  }
  if (s.isOk()) {
    sock.hangUp();
    for (int i = 0; i < 4 && s.isOk(); ++i) s = channel.receive(&frames);
    if (s.isOk()) return failed("the hang-up was never reported");
  }
  std::string again;
  common::ByteWriter w(&again);
  for (const transport::ControlMessage& m : frames) {
    w.u32(transport::kControlMagic);
    w.u32(m.type);
    w.u64(m.payload.size());
    w.bytes(m.payload.data(), m.payload.size());
  }
  if (input.compare(0, again.size(), again) != 0) return failed("frames differ from the bytes");
  if (s.code() == Code::kPeerLost) return again.size() == input.size() ? accepted() : rejected();
  return s.code() == Code::kInternal ? rejected() : unexpected(s);
}

std::vector<std::string> frameSeeds(Rng& rng) {
  std::vector<std::string> seeds;
  for (int i = 0; i < 16; ++i) {
    std::string s;
    common::ByteWriter w(&s);
    for (uint64_t n = rng.below(4); n > 0; --n) {
      const std::string payload = rng.bytes(rng.below(rng.chance(8) ? 4000 : 40));
      w.u32(transport::kControlMagic);
      w.u32(static_cast<uint32_t>(1 + rng.below(4)));
      w.u64(payload.size());
      s += payload;
    }
    seeds.push_back(s);
  }
  return seeds;
}

// The received messages framed again, to compare with the input they came from.
std::string encodedAgain(const std::vector<transport::PeerMessage>& messages) {
  std::string again;
  for (const transport::PeerMessage& m : messages) {
    again += transport::encodePeerHeader(m.frame);
    again.append(reinterpret_cast<const char*>(m.payload.data), m.frame.bytes);
  }
  return again;
}

// The input less its well-formed split offers (Note [Split copy]): a channel whose split copy
// is off (the fuzzed ones) refuses an offer, which is consumed without becoming a message.
std::string withoutOffers(const std::string& input) {
  std::string kept;
  size_t at = 0;
  while (input.size() - at >= 4) {
    common::ByteReader in(input.data() + at, 4);
    uint32_t header = 0;
    in.u32(&header);
    transport::PeerFrame frame;
    if (input.size() - at - 4 < header ||
        !transport::decodePeerHeader(input.data() + at + 4, header, &frame).isOk()) {
      break;
    }
    const uint64_t whole = 4 + header + frame.bytes;
    if (frame.kind != transport::PeerFrameKind::kSplitOffer) {
      if (input.size() - at < whole) break;
      kept.append(input, at, whole);
    } else if (input.size() - at < whole) {
      break;
    }
    at += whole;
  }
  return kept + input.substr(at);
}

// A kRefused message's payload, which PeerOps decodes on arrival (Note [Refused messages] in
// runtime/peer_ops_into.cc): a malformed one fails the rank as a malformed header does
// (rejected); one decoded must encode back to the same bytes. True with *out set when a
// message decides the outcome.
bool refusalsDecide(const std::vector<transport::PeerMessage>& messages, Outcome* out) {
  for (const transport::PeerMessage& m : messages) {
    if (m.frame.kind != transport::PeerFrameKind::kRefused) continue;
    uint64_t ordinal = 0;
    std::string reason;
    const Status s = transport::decodeRefusal(m.payload.data, m.frame.bytes, &ordinal, &reason);
    if (!s.isOk()) {
      *out = s.code() == Code::kInternal ? rejected() : unexpected(s);
      return true;
    }
    const std::string bytes(reinterpret_cast<const char*>(m.payload.data), m.frame.bytes);
    if (transport::encodeRefusal(ordinal, reason) != bytes) {
      *out = failed("a refusal encodes back to other bytes");
      return true;
    }
  }
  return false;
}

// Point-to-point frames: as the control frames, through PeerChannel::receive. Each message,
// encoded again (encodePeerHeader + payload), must be a prefix of the input; each refusal's
// payload decodes (refusalsDecide).
Outcome peerFrames(const std::string& input) {
  FedSocket sock;
  transport::PeerChannel channel(::dup(sock.fd()), 1);
  std::vector<transport::PeerMessage> messages;
  const size_t cuts[] = {input.size() / 3, input.size() * 2 / 3, input.size()};
  size_t fed = 0;
  bool moved = false;
  Status s;
  for (size_t cut : cuts) {
    sock.feed(input.substr(fed, cut - fed));
    fed = cut;
    s = channel.receive(&messages, &moved, /*socket_readable=*/true);
    if (!s.isOk()) break;
  }
  if (s.isOk()) {
    sock.hangUp();
    for (int i = 0; i < 4 && s.isOk(); ++i) {
      s = channel.receive(&messages, &moved, /*socket_readable=*/true);
    }
  }
  const std::string again = encodedAgain(messages);
  if (s.isOk()) return failed("the hang-up was never reported");
  if (input.compare(0, again.size(), again) != 0) return failed("messages differ from the bytes");
  Outcome refusal;
  if (refusalsDecide(messages, &refusal)) return refusal;
  if (s.code() == Code::kPeerLost) return again.size() == input.size() ? accepted() : rejected();
  return s.code() == Code::kInternal ? rejected() : unexpected(s);
}

// The same frames through a shared-memory channel (Note [Point-to-point over shm]): a
// PeerChannel reading a small ring that the input is written into as room appears (so frames
// wrap around its end), then the socket's hang-up, which must come out after every whole
// message. Then the peer lies in its counter (head far past tail): the reader must stay inside
// the ring (the sanitizer build checks) and report, not crash.
Outcome peerFramesShm(const std::string& input) {
  constexpr uint64_t kRingBytes = 4096;
  auto in_header = std::make_unique<transport::shm::RingHeader>();
  auto out_header = std::make_unique<transport::shm::RingHeader>();
  std::vector<uint8_t> in_data(kRingBytes), out_data(kRingBytes);
  transport::shm::Doorbell own{}, peer{};
  FedSocket sock;
  const int fd = ::dup(sock.fd());
  transport::PeerChannel channel(fd, 1);
  channel.attachSharedMemory(std::make_unique<transport::shm::RingStream>(transport::shm::RingLink{
      transport::shm::Ring(out_header.get(), out_data.data(), kRingBytes),
      transport::shm::Ring(in_header.get(), in_data.data(), kRingBytes), &peer, &own, fd}));
  transport::shm::Ring writer(in_header.get(), in_data.data(), kRingBytes);
  std::vector<transport::PeerMessage> messages;
  bool moved = false;
  Status s;
  size_t fed = 0;
  while (s.isOk()) {
    const size_t wrote = writer.write(reinterpret_cast<const uint8_t*>(input.data()) + fed,
                                      input.size() - fed);
    fed += wrote;
    moved = false;
    s = channel.receive(&messages, &moved, /*socket_readable=*/false);
    if (wrote == 0 && !moved) break;  // the ring is drained and the input is all in
  }
  const std::string again = encodedAgain(messages);
  const std::string data = withoutOffers(input);
  if (data.compare(0, again.size(), again) != 0) return failed("messages differ from the bytes");
  Outcome refusal;
  if (refusalsDecide(messages, &refusal)) return refusal;
  if (s.isOk()) {
    sock.hangUp();
    s = channel.receive(&messages, &moved, /*socket_readable=*/true);
    if (s.isOk()) return failed("the hang-up was never reported");
  }
  Outcome outcome = s.code() == Code::kPeerLost
                        ? (fed == input.size() && again.size() == data.size() ? accepted()
                                                                                : rejected())
                        : s.code() == Code::kInternal ? rejected() : unexpected(s);
  // The lie: whatever the channel's state, a read stays inside the ring.
  in_header->head.store(in_header->tail.load() + (uint64_t{1} << 40));
  for (int i = 0; i < 4; ++i) channel.receive(&messages, &moved, /*socket_readable=*/false);
  return outcome;
}

std::vector<std::string> peerFrameSeeds(Rng& rng) {
  std::vector<std::string> seeds;
  for (int i = 0; i < 16; ++i) {
    std::string s;
    for (uint64_t n = rng.below(4); n > 0; --n) {
      transport::PeerFrame frame;
      frame.kind = static_cast<transport::PeerFrameKind>(rng.chance(4) ? rng.below(15) : 0);
      if (frame.kind == transport::PeerFrameKind::kBoardPost ||
          frame.kind == transport::PeerFrameKind::kBoardState) {  // Note [One round] K
        const bool post = frame.kind == transport::PeerFrameKind::kBoardPost;
        frame.tag = post ? static_cast<int64_t>(1 + rng.below(1000)) : 0;
        frame.bytes = post ? 1 + rng.below(rng.chance(8) ? 40000 : 200)
                           : transport::kBoardStateBytes;
        s += transport::encodePeerHeader(frame) + rng.bytes(frame.bytes);
        continue;
      }
      if (frame.kind == transport::PeerFrameKind::kRefused) {  // an ordinal and a reason
        std::string reason = rng.bytes(1 + rng.below(rng.chance(8) ? 1100 : 60));
        for (char& c : reason) c = static_cast<char>(0x20 + static_cast<unsigned char>(c) % 95);
        const std::string payload = transport::encodeRefusal(rng.below(100), reason);
        frame.tag = static_cast<int64_t>(rng.below(1000));
        frame.bytes = payload.size();
        s += transport::encodePeerHeader(frame) + payload;
        continue;
      }
      if (frame.kind >= transport::PeerFrameKind::kSplitAccept) {  // answers: no dims, tag 0
        frame.bytes = frame.kind == transport::PeerFrameKind::kSplitAccept
                          ? transport::kSplitEndpointBytes
                      : frame.kind == transport::PeerFrameKind::kSplitDone
                          ? transport::kSplitDoneBytes
                          : 0;
        s += transport::encodePeerHeader(frame) + rng.bytes(frame.bytes);
        continue;
      }
      if (frame.kind == transport::PeerFrameKind::kDeviceRead ||
          frame.kind == transport::PeerFrameKind::kDeviceRefused ||
          frame.kind == transport::PeerFrameKind::kNcclId) {  // a receipt, an NCCL unique id
        frame.bytes = frame.kind == transport::PeerFrameKind::kNcclId ? transport::kNcclIdBytes
                                                                      : transport::kDeviceReadBytes;
        s += transport::encodePeerHeader(frame) + rng.bytes(frame.bytes);
        continue;
      }
      frame.tag = static_cast<int64_t>(rng.below(1000));
      frame.dtype = static_cast<common::DataType>(rng.below(common::kNumDataTypes));
      for (uint64_t d = rng.below(4); d > 0; --d) {
        frame.shape.push_back(static_cast<int64_t>(rng.below(rng.chance(8) ? 300 : 6)));
      }
      if (frame.kind == transport::PeerFrameKind::kDeviceResend) {  // uint8 bytes
        frame.dtype = common::DataType::kUint8;
        frame.shape = {static_cast<int64_t>(rng.below(300))};
      }
      transport::peerPayloadBytes(frame.dtype, frame.shape, &frame.bytes);
      if (frame.kind == transport::PeerFrameKind::kDevice) {
        frame.bytes = transport::kDeviceMessageBytes;  // the tensor stays on the device
      }
      if (frame.kind == transport::PeerFrameKind::kDeviceNccl) frame.bytes = 0;  // by NCCL
      if (frame.kind == transport::PeerFrameKind::kSplitOffer) {  // where the bytes wait
        if (frame.bytes == 0) frame.shape = {1};
        frame.bytes = transport::kSplitEndpointBytes;
      }
      s += transport::encodePeerHeader(frame) + rng.bytes(frame.bytes);
    }
    seeds.push_back(s);
  }
  return seeds;
}

// A kDevice frame's payload (runtime/peer_ops.cc decodes it on arrival): the input is a u64
// tensor size, then the payload. Accepted means the tensor lies inside the claimed segment and
// the message encodes back to the same bytes; a receipt decodes only from its 8 bytes.
Outcome deviceMessages(const std::string& input) {
  common::ByteReader in(input.data(), input.size());
  uint64_t tensor_bytes = 0;
  if (!in.u64(&tensor_bytes)) return rejected();
  const char* payload = input.data() + 8;
  const size_t size = input.size() - 8;
  uint64_t sequence = 0;
  const Status read = transport::decodeDeviceRead(payload, size, &sequence);
  if (read.isOk() != (size == transport::kDeviceReadBytes)) return failed("receipt size");
  transport::DeviceMessage m;
  const Status s = transport::decodeDeviceMessage(payload, size, tensor_bytes, &m);
  if (!s.isOk()) return s.code() == Code::kInternal ? rejected() : unexpected(s);
  if (m.offset > m.segment_bytes || tensor_bytes > m.segment_bytes - m.offset) {
    return failed("accepted a tensor outside its segment");
  }
  if (transport::encodeDeviceMessage(m) != std::string(payload, size)) {
    return failed("the message encodes to other bytes");
  }
  return accepted();
}

std::vector<std::string> deviceMessageSeeds(Rng& rng) {
  std::vector<std::string> seeds;
  for (int i = 0; i < 12; ++i) {
    transport::DeviceMessage m;
    m.sequence = rng.below(100);
    m.segment = rng.below(8);
    m.segment_bytes = uint64_t{1} << (20 + rng.below(4));
    m.base_offset = rng.chance(4) ? 4096 * rng.below(16) : 0;
    m.offset = rng.below(m.segment_bytes) & ~uint64_t{255};
    const uint64_t tensor_bytes =
        rng.chance(4) ? m.segment_bytes + 1 : rng.below(m.segment_bytes - m.offset + 1);
    std::string s;
    common::ByteWriter w(&s);
    w.u64(tensor_bytes);
    seeds.push_back(s + transport::encodeDeviceMessage(m));
  }
  return seeds;
}

}  // namespace

void addTransportTargets(std::vector<Target>* out) {
  out->push_back({"handshake_acceptor", "tcp::acceptorHandshake (hello, job id, proof)",
                  helloSeeds, handshakeAcceptor});
  out->push_back({"handshake_dialer", "tcp::dialerHandshake (challenge, welcome)",
                  challengeSeeds, handshakeDialer});
  out->push_back({"control_frames", "transport::ControlChannel::receive", frameSeeds,
                  controlFrames});
  out->push_back({"peer_frames", "transport::PeerChannel::receive (decodePeerHeader)",
                  peerFrameSeeds, peerFrames});
  out->push_back({"peer_frames_shm", "transport::PeerChannel::receive over a ring (RingStream)",
                  peerFrameSeeds, peerFramesShm});
  out->push_back({"device_messages", "transport::decodeDeviceMessage and decodeDeviceRead",
                  deviceMessageSeeds, deviceMessages});
}

}  // namespace hvd::fuzz
