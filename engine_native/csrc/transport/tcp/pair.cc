// TcpPair (transport/tcp/pair.h): one non-blocking send/recv per call.
#include "transport/tcp/pair.h"

#include <sys/socket.h>

#include <cerrno>
#include <string>

#include "transport/tcp/socket.h"

namespace hvd::transport::tcp {

using common::Status;

Status TcpPair::sendSome(const uint8_t* data, size_t n, size_t* moved) {
  *moved = 0;
  if (n == 0) return Status::ok();
  while (true) {
    const ssize_t sent = ::send(fd_, data, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (sent >= 0) {
      *moved = static_cast<size_t>(sent);
      return Status::ok();
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
    return common::peerLost("send: " + errnoText(errno));
  }
}

Status TcpPair::recvSome(uint8_t* data, size_t n, size_t* moved) {
  *moved = 0;
  if (n == 0) return Status::ok();
  while (true) {
    const ssize_t got = ::recv(fd_, data, n, MSG_DONTWAIT);
    if (got > 0) {
      *moved = static_cast<size_t>(got);
      return Status::ok();
    }
    if (got == 0) return common::peerLost("recv: connection closed");
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::ok();
    return common::peerLost("recv: " + errnoText(errno));
  }
}

}  // namespace hvd::transport::tcp
