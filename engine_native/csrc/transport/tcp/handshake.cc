// The mesh handshake (transport/tcp/handshake.h).
//
// Note [Mesh handshake]
// Every new connection, data or control, runs these steps before any other byte is trusted.
// Integers are little-endian; nonces are 32 bytes from getrandom(2).
//   A. Dialer -> acceptor, Hello: u32 magic 'HVDH', u16 version, u8 kind (1 data, 2 control,
//      3 peer), u8 job id length, i32 dialer rank, i32 acceptor rank (whom the dialer means to
//      reach), nonce_d, job id bytes.
//   B. Acceptor checks the magic and version (else: garbage), the job id (else: wrong job), the
//      acceptor rank (else: the dialer reached a stale address), the dialer rank and the kind
//      (admit(): in range, expected, not yet connected). Then, Challenge: u32 magic 'HVDA',
//      nonce_a, mac_a = HMAC(secret, transcript("acceptor")).
//   C. Dialer checks mac_a in constant time (else: the listener does not know the secret, and
//      the dialer hangs up). Proof: mac_d = HMAC(secret, transcript("dialer")).
//   D. Acceptor checks mac_d in constant time (else: authentication failed, drop). Welcome:
//      u32 magic 'HVDK'.
//   E. Dialer reads the Welcome: both ends now know the other holds the secret, belongs to this
//      job and is the rank it claims, so the connection is established.
// transcript(role) = role || kind || dialer rank || acceptor rank || job id || nonce_d || nonce_a,
// so a MAC is bound to one direction, one connection and one pair of ranks: neither a replayed
// nor a reflected MAC verifies. The acceptor gives each connection kAcceptorHandshakeSeconds
// from accept to Welcome; a stalled or silent dialer is dropped and accepting goes on.
#include "transport/tcp/handshake.h"

#include <string>

#include "common/byte_codec.h"
#include "common/hmac.h"

namespace hvd::transport::tcp {

using common::Status;

namespace {

constexpr uint32_t kHelloMagic = 0x48445648;      // "HVDH"
constexpr uint32_t kChallengeMagic = 0x41445648;  // "HVDA"
constexpr uint32_t kWelcomeMagic = 0x4b445648;    // "HVDK"
constexpr uint16_t kVersion = 1;
constexpr size_t kNonceBytes = 32;
constexpr size_t kHelloFixedBytes = 16 + kNonceBytes;
constexpr size_t kChallengeBytes = 4 + kNonceBytes + common::kSha256Bytes;

struct Hello {
  ChannelKind kind = ChannelKind::kData;
  int dialer_rank = -1;
  int acceptor_rank = -1;
  uint8_t nonce_d[kNonceBytes] = {};
  std::string job_id;
};

common::Digest transcriptMac(const std::string& secret, const char* role, const Hello& hello,
                             const uint8_t* nonce_a) {
  std::string t(role);
  common::ByteWriter w(&t);
  w.u8(static_cast<uint8_t>(hello.kind));
  w.i32(hello.dialer_rank);
  w.i32(hello.acceptor_rank);
  w.u8(static_cast<uint8_t>(hello.job_id.size()));
  w.bytes(hello.job_id.data(), hello.job_id.size());
  w.bytes(hello.nonce_d, kNonceBytes);
  w.bytes(nonce_a, kNonceBytes);
  return common::hmacSha256(secret, t.data(), t.size());
}

// Reads one handshake message part; maps a timeout to the acceptor's "stalled" reason.
Status readPart(int fd, void* data, size_t n, Deadline deadline, const char* what) {
  Status s = readFull(fd, data, n, deadline);
  if (s.code() == common::Code::kTimeout) {
    return common::timedOut(std::string("stalled in the handshake waiting for the ") + what);
  }
  if (!s.isOk()) {
    return common::peerLost(std::string("closed during the handshake before the ") + what +
                            " (" + s.message() + ")");
  }
  return s;
}

Status readHello(int fd, Deadline deadline, Hello* hello) {
  uint8_t fixed[kHelloFixedBytes];
  HVD_RETURN_IF_ERROR(readPart(fd, fixed, sizeof(fixed), deadline, "hello"));
  common::ByteReader in(fixed, sizeof(fixed));
  uint32_t magic = 0;
  uint16_t version = 0;
  uint8_t kind = 0, job_id_bytes = 0;
  if (!in.u32(&magic) || magic != kHelloMagic) {
    return common::internalError("garbage instead of a hello");
  }
  if (!in.u16(&version) || version != kVersion) {
    return common::internalError("unsupported handshake version " + std::to_string(version));
  }
  if (!in.u8(&kind) || kind < static_cast<uint8_t>(ChannelKind::kData) ||
      kind > static_cast<uint8_t>(ChannelKind::kPeer)) {
    return common::internalError("unknown channel kind " + std::to_string(kind));
  }
  hello->kind = static_cast<ChannelKind>(kind);
  if (!in.u8(&job_id_bytes) || !in.i32(&hello->dialer_rank) || !in.i32(&hello->acceptor_rank) ||
      !in.bytes(hello->nonce_d, kNonceBytes)) {
    return common::internalError("truncated hello: " + in.error());
  }
  hello->job_id.resize(job_id_bytes);
  if (!hello->job_id.empty()) {
    HVD_RETURN_IF_ERROR(readPart(fd, &hello->job_id[0], hello->job_id.size(), deadline, "job id"));
  }
  return Status::ok();
}

std::string printable(const std::string& text) {
  std::string out;
  for (char c : text.substr(0, 64)) out += (c >= 32 && c < 127) ? c : '?';
  return out;
}

}  // namespace

const char* channelKindName(ChannelKind kind) {
  switch (kind) {
    case ChannelKind::kData: return "data";
    case ChannelKind::kControl: return "control";
    case ChannelKind::kPeer: return "peer";
  }
  return "unknown";
}

Status dialerHandshake(int fd, const JobIdentity& self, int acceptor_rank, ChannelKind kind,
                       Deadline deadline) {
  if (self.job_id.size() > kMaxJobIdBytes) {
    return common::invalidArgument("job id longer than 255 bytes");
  }
  Hello hello;
  hello.kind = kind;
  hello.dialer_rank = self.rank;
  hello.acceptor_rank = acceptor_rank;
  hello.job_id = self.job_id;
  if (!common::randomBytes(hello.nonce_d, kNonceBytes)) {
    return common::internalError("no random bytes for the handshake nonce");
  }
  std::string msg;  // step A
  common::ByteWriter w(&msg);
  w.u32(kHelloMagic);
  w.u16(kVersion);
  w.u8(static_cast<uint8_t>(kind));
  w.u8(static_cast<uint8_t>(self.job_id.size()));
  w.i32(self.rank);
  w.i32(acceptor_rank);
  w.bytes(hello.nonce_d, kNonceBytes);
  w.bytes(self.job_id.data(), self.job_id.size());
  HVD_RETURN_IF_ERROR(writeFull(fd, msg.data(), msg.size(), deadline));

  uint8_t challenge[kChallengeBytes];  // step C
  HVD_RETURN_IF_ERROR(readPart(fd, challenge, sizeof(challenge), deadline, "challenge"));
  common::ByteReader in(challenge, sizeof(challenge));
  uint32_t magic = 0;
  uint8_t nonce_a[kNonceBytes];
  common::Digest mac_a{};
  const bool parsed = in.u32(&magic) && in.bytes(nonce_a, kNonceBytes) &&
                      in.bytes(mac_a.data(), mac_a.size());
  const common::Digest expected = transcriptMac(self.secret, "acceptor", hello, nonce_a);
  const common::Digest proof = transcriptMac(self.secret, "dialer", hello, nonce_a);
  if (!parsed || magic != kChallengeMagic ||
      !common::constantTimeEqual(expected.data(), mac_a.data(), expected.size())) {
    // Still send our proof (it reveals nothing about the real secret), so that a legitimate
    // acceptor logs "authentication failed" rather than a hang-up.
    writeFull(fd, proof.data(), proof.size(), deadline);
    return common::internalError("rank " + std::to_string(acceptor_rank) +
                                 "'s listener failed to prove the job secret (is the secret "
                                 "the same on every rank?)");
  }
  HVD_RETURN_IF_ERROR(writeFull(fd, proof.data(), proof.size(), deadline));

  uint8_t welcome[4];  // step E
  Status s = readPart(fd, welcome, sizeof(welcome), deadline, "welcome");
  if (!s.isOk()) return common::peerLost(s.message() + "; the secret may differ");
  common::ByteReader welcome_in(welcome, sizeof(welcome));
  uint32_t welcome_magic = 0;
  if (!welcome_in.u32(&welcome_magic) || welcome_magic != kWelcomeMagic) {
    return common::internalError("bad welcome");
  }
  return Status::ok();
}

Status acceptorHandshake(int fd, const JobIdentity& self, const AdmitFunction& admit,
                         Deadline deadline, int* dialer_rank, ChannelKind* kind) {
  Hello hello;  // step B
  HVD_RETURN_IF_ERROR(readHello(fd, deadline, &hello));
  if (hello.job_id != self.job_id) {
    return common::invalidArgument("wrong job id '" + printable(hello.job_id) + "'");
  }
  if (hello.acceptor_rank != self.rank) {
    return common::invalidArgument("it dialed rank " + std::to_string(hello.acceptor_rank) +
                                   " but this is rank " + std::to_string(self.rank));
  }
  if (hello.dialer_rank < 0 || hello.dialer_rank >= self.size) {
    return common::invalidArgument("rank " + std::to_string(hello.dialer_rank) +
                                   " is outside the job (size " + std::to_string(self.size) + ")");
  }
  const std::string refusal = admit(hello.dialer_rank, hello.kind);
  if (!refusal.empty()) return common::invalidArgument(refusal);

  uint8_t nonce_a[kNonceBytes];
  if (!common::randomBytes(nonce_a, kNonceBytes)) {
    return common::internalError("no random bytes for the handshake nonce");
  }
  const common::Digest mac_a = transcriptMac(self.secret, "acceptor", hello, nonce_a);
  std::string challenge;
  common::ByteWriter w(&challenge);
  w.u32(kChallengeMagic);
  w.bytes(nonce_a, kNonceBytes);
  w.bytes(mac_a.data(), mac_a.size());
  HVD_RETURN_IF_ERROR(writeFull(fd, challenge.data(), challenge.size(), deadline));

  uint8_t proof[common::kSha256Bytes];  // step D
  HVD_RETURN_IF_ERROR(readPart(fd, proof, sizeof(proof), deadline, "proof"));
  const common::Digest expected = transcriptMac(self.secret, "dialer", hello, nonce_a);
  if (!common::constantTimeEqual(expected.data(), proof, sizeof(proof))) {
    return common::invalidArgument("authentication failed (wrong secret)");
  }
  std::string welcome;
  common::ByteWriter(&welcome).u32(kWelcomeMagic);
  HVD_RETURN_IF_ERROR(writeFull(fd, welcome.data(), welcome.size(), deadline));
  *dialer_rank = hello.dialer_rank;
  *kind = hello.kind;
  return Status::ok();
}

}  // namespace hvd::transport::tcp
