// Socket helpers for the mesh bootstrap: resolve, listen, dial with retry, accept, and whole
// reads/writes bounded by a deadline (poll-based, so they work on non-blocking fds). Called by
// Mesh::connect on the bootstrap thread and by the shm setup; no state of their own.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

#include "common/status.h"

namespace hvd::transport::tcp {

using Clock = std::chrono::steady_clock;
using Deadline = Clock::time_point;

constexpr int kListenBacklog = 128;
constexpr int kDataSocketBufferBytes = 4 << 20;

Deadline deadlineAfter(double seconds);
// Milliseconds until `deadline`, at least 0 and at most cap_ms.
int millisecondsLeft(Deadline deadline, int cap_ms);

std::string errnoText(int err);

// Binds `address` (IPv4/IPv6 literal or host name) on port 0 and listens (backlog 128).
// The fd is non-blocking and close-on-exec; *port receives the chosen port.
common::Status listenOn(const std::string& address, int* fd, int* port);

// Connects to address:port. Connection refused (the peer is not listening yet) and other
// transient failures are retried with a short backoff until `deadline`; then kTimeout names
// the last error. The fd is non-blocking, close-on-exec, TCP_NODELAY, with 4 MiB buffers set
// before connect (so window scaling can use them).
common::Status dial(const std::string& address, int port, Deadline deadline, int* fd);

// Takes one pending connection from a non-blocking listener. *fd = -1 when none is pending.
// The fd is non-blocking, close-on-exec, TCP_NODELAY, with the listener's 4 MiB buffers.
common::Status acceptOne(int listen_fd, int* fd, std::string* peer_address);

// Whole transfers on a (possibly non-blocking) socket, waiting with poll until `deadline`.
// kTimeout when the deadline passes, kPeerLost on EOF/reset.
common::Status writeFull(int fd, const void* data, size_t n, Deadline deadline);
common::Status readFull(int fd, void* data, size_t n, Deadline deadline);

bool setNonBlocking(int fd);
void setBufferSizes(int fd, int bytes);
void setNoDelay(int fd);
std::string peerAddress(int fd);  // "host:port" or "?" when unknown
void closeFd(int* fd);            // closes and sets -1; no-op for -1

}  // namespace hvd::transport::tcp
