// TcpPair: the data byte stream to one peer over an authenticated, non-blocking TCP socket.
// Created by Mesh::connect, used by the background thread through Comm::exchange. The socket
// belongs to the Mesh (it outlives the pair and also serves liveness checks), as does the
// abort eventfd, which Comm polls beside the socket so Mesh::abort ends a wait at once.
#pragma once

#include "transport/pair.h"

namespace hvd::transport::tcp {

class TcpPair : public Pair {
 public:
  TcpPair(int fd, int peer, int abort_fd) : fd_(fd), peer_(peer), abort_fd_(abort_fd) {}

  PairKind kind() const override { return PairKind::kTcp; }
  int peer() const override { return peer_; }
  common::Status sendSome(const uint8_t* data, size_t n, size_t* moved) override;
  common::Status recvSome(uint8_t* data, size_t n, size_t* moved) override;
  int pollFd() const override { return fd_; }
  int abortFd() const { return abort_fd_; }  // readable once the mesh is aborted; may be -1

 private:
  int fd_;
  int peer_;
  int abort_fd_;
};

}  // namespace hvd::transport::tcp
