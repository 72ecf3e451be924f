// ConcurrentAcceptor (transport/tcp/acceptor.h).
//
// Note [Concurrent accept]
//   An acceptor grants each connection kAcceptorHandshakeSeconds to prove the job's secret.
//   Handshakes run one at a time, a few connections that never speak (a port scanner, a
//   health check, a stale rank of another job) would hold the ranks' own connections in the
//   backlog for 2 s each, and init() could time out. So every accepted connection gets its own
//   thread for its handshake, and the bootstrap thread only collects the outcomes: a silent
//   connection costs a sleeping thread for at most 2 s, never another connection's time. At
//   most kMaxRunning handshakes run at once; beyond that connections wait in the backlog.
//   What depends on the mesh's state (a second connection from the same rank) is decided by
//   the caller when it takes an outcome, so the threads share nothing but the outcome list.
#include "transport/tcp/acceptor.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>

namespace hvd::transport::tcp {

namespace {
constexpr size_t kMaxRunning = 256;
}

struct ConcurrentAcceptor::Running {
  int fd;
  std::string from;
};

ConcurrentAcceptor::ConcurrentAcceptor(int listen_fd, JobIdentity identity, AdmitFunction admit)
    : listen_fd_(listen_fd), identity_(std::move(identity)), admit_(std::move(admit)) {
  wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
}

ConcurrentAcceptor::~ConcurrentAcceptor() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (Running* r : running_) ::shutdown(r->fd, SHUT_RDWR);  // its handshake fails at once
  }
  for (std::thread& t : threads_) t.join();
  for (AcceptOutcome& o : ended_) closeFd(&o.fd);
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

void ConcurrentAcceptor::handshake(Running* running, Deadline deadline) {
  AcceptOutcome out;
  out.fd = running->fd;
  out.from = running->from;
  out.status = acceptorHandshake(out.fd, identity_, admit_,
                                 std::min(deadline, deadlineAfter(kAcceptorHandshakeSeconds)),
                                 &out.rank, &out.kind);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running_.erase(std::find(running_.begin(), running_.end(), running));
    ended_.push_back(std::move(out));
  }
  delete running;
  const uint64_t one = 1;
  // Only a saturated counter fails (EAGAIN), and then poll() finds the eventfd readable anyway.
  [[maybe_unused]] const ssize_t written = ::write(wake_fd_, &one, sizeof(one));
}

common::Status ConcurrentAcceptor::poll(Deadline deadline, int wait_ms,
                                        std::vector<AcceptOutcome>* ended) {
  size_t running = 0;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    running = running_.size();
  }
  pollfd fds[2] = {{wake_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
  const int nfds = running < kMaxRunning ? 2 : 1;
  if (::poll(fds, nfds, wait_ms) > 0 && (fds[0].revents & POLLIN)) {
    uint64_t count = 0;
    if (::read(wake_fd_, &count, sizeof(count)) < 0) count = 0;  // EAGAIN: a racing read
  }
  if (nfds == 2 && (fds[1].revents & POLLIN)) {
    for (size_t n = running; n < kMaxRunning; ++n) {
      int fd = -1;
      std::string from;
      HVD_RETURN_IF_ERROR(acceptOne(listen_fd_, &fd, &from));
      if (fd < 0) break;  // nothing more waiting
      Running* r = new Running{fd, std::move(from)};
      {
        std::lock_guard<std::mutex> lock(mutex_);
        running_.push_back(r);
      }
      threads_.emplace_back(&ConcurrentAcceptor::handshake, this, r, deadline);
    }
  }
  std::lock_guard<std::mutex> lock(mutex_);
  for (AcceptOutcome& o : ended_) ended->push_back(std::move(o));
  ended_.clear();
  return common::Status::ok();
}

}  // namespace hvd::transport::tcp
