// The mesh handshake: both ends of a new TCP connection prove the per-job secret to each other
// (HMAC-SHA256 over fresh nonces) and the dialer names its rank and the channel kind. Run by
// Mesh::connect on the bootstrap thread, on fds from transport/tcp/socket.h. See
// Note [Mesh handshake] in handshake.cc for the wire protocol.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"
#include "transport/tcp/socket.h"

namespace hvd::transport::tcp {

// kPeer: point-to-point messages (transport/peer_channel.h), one connection per pair of ranks.
enum class ChannelKind : uint8_t { kData = 1, kControl = 2, kPeer = 3 };

const char* channelKindName(ChannelKind kind);

// What this process knows about the job; the same on every rank except `rank`.
struct JobIdentity {
  std::string secret;
  std::string job_id;
  int rank = -1;
  int size = 0;
};

// Seconds an acceptor grants one connection to complete its handshake.
constexpr double kAcceptorHandshakeSeconds = 2.0;
constexpr size_t kMaxJobIdBytes = 255;

// Dialer side (steps A, C, E). Errors: kPeerLost when the acceptor closed the connection
// (it rejected us, or is restarting), kInternal when the acceptor failed to prove the secret.
common::Status dialerHandshake(int fd, const JobIdentity& self, int acceptor_rank,
                               ChannelKind kind, Deadline deadline);

// Acceptor side (steps B, D). `admit(rank, kind)` returns "" when such a connection is expected
// now, else the reason it is not. On success *dialer_rank and *kind name the connection. On
// failure the Status message is the reason to log when dropping the connection.
using AdmitFunction = std::function<std::string(int rank, ChannelKind kind)>;
common::Status acceptorHandshake(int fd, const JobIdentity& self, const AdmitFunction& admit,
                                 Deadline deadline, int* dialer_rank, ChannelKind* kind);

}  // namespace hvd::transport::tcp
