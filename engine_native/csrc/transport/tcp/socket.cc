// Socket helpers (transport/tcp/socket.h).
#include "transport/tcp/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>

namespace hvd::transport::tcp {

using common::Status;

namespace {

struct AddressList {
  addrinfo* head = nullptr;
  ~AddressList() {
    if (head) freeaddrinfo(head);
  }
};

Status resolve(const std::string& host, int port, bool passive, AddressList* out) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = passive ? AI_PASSIVE : 0;
  const std::string service = std::to_string(port);
  const int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &out->head);
  if (rc != 0) {
    return common::invalidArgument("cannot resolve '" + host + "': " + gai_strerror(rc));
  }
  return Status::ok();
}

std::string formatAddress(const sockaddr* sa) {
  char host[INET6_ADDRSTRLEN] = "?";
  int port = 0;
  if (sa->sa_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(sa);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (sa->sa_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(sa);
    inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof(host));
    port = ntohs(in6->sin6_port);
    return "[" + std::string(host) + "]:" + std::to_string(port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

// Errors worth retrying while the peer is still starting (or its backlog is momentarily full).
bool isTransient(int err) {
  return err == ECONNREFUSED || err == ECONNRESET || err == ETIMEDOUT || err == EHOSTUNREACH ||
         err == ENETUNREACH || err == EAGAIN || err == EINTR;
}

// One connection attempt to one resolved address; *err receives errno on failure.
int tryConnect(const addrinfo* ai, Deadline deadline, int* err) {
  const int fd = ::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  setBufferSizes(fd, kDataSocketBufferBytes);
  setNoDelay(fd);
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return fd;
  if (errno != EINPROGRESS) {
    *err = errno;
    ::close(fd);
    return -1;
  }
  pollfd p{fd, POLLOUT, 0};
  const int ready = ::poll(&p, 1, millisecondsLeft(deadline, 1 << 30));
  int so_error = ready > 0 ? 0 : ETIMEDOUT;
  socklen_t len = sizeof(so_error);
  if (ready > 0 && ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) so_error = errno;
  if (so_error != 0) {
    *err = so_error;
    ::close(fd);
    return -1;
  }
  return fd;
}

}  // namespace

Deadline deadlineAfter(double seconds) {
  return Clock::now() + std::chrono::microseconds(static_cast<int64_t>(seconds * 1e6));
}

int millisecondsLeft(Deadline deadline, int cap_ms) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  // Round up so a wait never ends just short of the deadline and spins on a 0 ms poll.
  const int64_t ms = left.count() + 1;
  return static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(ms, cap_ms)));
}

std::string errnoText(int err) { return std::strerror(err); }

Status listenOn(const std::string& address, int* fd, int* port) {
  if (address.empty()) {
    return common::invalidArgument("listen: empty bind address (pass an interface address, "
                                   "e.g. 127.0.0.1)");
  }
  AddressList list;
  HVD_RETURN_IF_ERROR(resolve(address, 0, true, &list));
  std::string last_error = "no address";
  for (const addrinfo* ai = list.head; ai != nullptr; ai = ai->ai_next) {
    int s = ::socket(ai->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (s < 0) {
      last_error = errnoText(errno);
      continue;
    }
    // Accepted sockets inherit the buffer sizes, which must be set before the handshake so
    // TCP window scaling can use them.
    setBufferSizes(s, kDataSocketBufferBytes);
    sockaddr_storage bound{};
    socklen_t len = sizeof(bound);
    if (::bind(s, ai->ai_addr, ai->ai_addrlen) != 0 || ::listen(s, kListenBacklog) != 0 ||
        ::getsockname(s, reinterpret_cast<sockaddr*>(&bound), &len) != 0) {
      last_error = errnoText(errno);
      ::close(s);
      continue;
    }
    *port = bound.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
    *fd = s;
    return Status::ok();
  }
  return common::internalError("listen on " + address + " failed: " + last_error);
}

Status dial(const std::string& address, int port, Deadline deadline, int* fd) {
  AddressList list;
  HVD_RETURN_IF_ERROR(resolve(address, port, false, &list));
  int last_errno = ETIMEDOUT;
  auto backoff = std::chrono::milliseconds(5);
  while (true) {
    for (const addrinfo* ai = list.head; ai != nullptr; ai = ai->ai_next) {
      int err = 0;
      const int s = tryConnect(ai, deadline, &err);
      if (s >= 0) {
        *fd = s;
        return Status::ok();
      }
      last_errno = err;
      if (!isTransient(err)) {
        return common::internalError("connect to " + address + ":" + std::to_string(port) +
                                     " failed: " + errnoText(err));
      }
    }
    if (Clock::now() + backoff >= deadline) break;
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
  return common::timedOut("connect to " + address + ":" + std::to_string(port) +
                          " did not succeed before the deadline (last error: " +
                          errnoText(last_errno) + ")");
}

Status acceptOne(int listen_fd, int* fd, std::string* peer_address) {
  *fd = -1;
  sockaddr_storage from{};
  socklen_t len = sizeof(from);
  while (true) {
    const int s = ::accept4(listen_fd, reinterpret_cast<sockaddr*>(&from), &len,
                            SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (s >= 0) {
      setNoDelay(s);  // buffer sizes are inherited from the listener, TCP_NODELAY is not
      *fd = s;
      *peer_address = formatAddress(reinterpret_cast<sockaddr*>(&from));
      return Status::ok();
    }
    if (errno == EINTR) continue;
    // The connection may have gone away between poll and accept; that is not our error.
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == ECONNABORTED || errno == EPROTO) {
      return Status::ok();
    }
    return common::internalError("accept failed: " + errnoText(errno));
  }
}

Status writeFull(int fd, const void* data, size_t n, Deadline deadline) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t sent = ::send(fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent > 0) {
      p += sent;
      n -= static_cast<size_t>(sent);
      continue;
    }
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0 && errno != EAGAIN && errno != EWOULDBLOCK) {
      return common::peerLost(errnoText(errno));
    }
    pollfd pfd{fd, POLLOUT, 0};
    const int wait_ms = millisecondsLeft(deadline, 1 << 30);
    if (wait_ms == 0 || ::poll(&pfd, 1, wait_ms) == 0) return common::timedOut("write timed out");
  }
  return Status::ok();
}

Status readFull(int fd, void* data, size_t n, Deadline deadline) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
    if (got > 0) {
      p += got;
      n -= static_cast<size_t>(got);
      continue;
    }
    if (got == 0) return common::peerLost("connection closed");
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return common::peerLost(errnoText(errno));
    pollfd pfd{fd, POLLIN, 0};
    const int wait_ms = millisecondsLeft(deadline, 1 << 30);
    if (wait_ms == 0 || ::poll(&pfd, 1, wait_ms) == 0) return common::timedOut("read timed out");
  }
  return Status::ok();
}

bool setNonBlocking(int fd) {
  const int flags = ::fcntl(fd, F_GETFL, 0);
  return flags >= 0 && ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) == 0;
}

void setBufferSizes(int fd, int bytes) {
  ::setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  ::setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
}

void setNoDelay(int fd) {
  const int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

std::string peerAddress(int fd) {
  sockaddr_storage peer{};
  socklen_t len = sizeof(peer);
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len) != 0) return "?";
  return formatAddress(reinterpret_cast<sockaddr*>(&peer));
}

void closeFd(int* fd) {
  if (*fd >= 0) ::close(*fd);
  *fd = -1;
}

}  // namespace hvd::transport::tcp
