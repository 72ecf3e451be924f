// Accepting mesh connections with their handshakes run side by side (Note [Concurrent accept]).
// Used by Mesh::connect on the bootstrap thread.
#pragma once

#include <condition_variable>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/status.h"
#include "transport/tcp/handshake.h"

namespace hvd::transport::tcp {

// A connection whose acceptor handshake has ended: `status` ok and `rank`/`kind` set, or the
// reason to drop it. `fd` belongs to whoever takes the outcome.
struct AcceptOutcome {
  int fd = -1;
  std::string from;
  common::Status status;
  int rank = -1;
  ChannelKind kind = ChannelKind::kData;
};

class ConcurrentAcceptor {
 public:
  // `admit` runs on the handshake threads: it may only read what never changes while they run.
  ConcurrentAcceptor(int listen_fd, JobIdentity identity, AdmitFunction admit);
  // Ends every handshake still running (shuts its socket down), joins the threads and closes
  // every connection nobody took.
  ~ConcurrentAcceptor();
  ConcurrentAcceptor(const ConcurrentAcceptor&) = delete;
  ConcurrentAcceptor& operator=(const ConcurrentAcceptor&) = delete;

  // Waits up to `wait_ms` for a new connection or an ended handshake; starts a handshake for
  // every connection waiting on the listener (each bounded by kAcceptorHandshakeSeconds and
  // `deadline`) and moves the ended ones to *ended. An error only when accept() itself fails.
  common::Status poll(Deadline deadline, int wait_ms, std::vector<AcceptOutcome>* ended);

 private:
  struct Running;
  void handshake(Running* running, Deadline deadline);

  const int listen_fd_;
  const JobIdentity identity_;
  const AdmitFunction admit_;
  int wake_fd_ = -1;  // eventfd: readable once a handshake ended
  std::mutex mutex_;  // guards running_ and ended_
  std::vector<Running*> running_;
  std::vector<AcceptOutcome> ended_;
  std::vector<std::thread> threads_;
};

}  // namespace hvd::transport::tcp
