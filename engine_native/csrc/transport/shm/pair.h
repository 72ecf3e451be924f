// ShmPair: the data byte stream to one peer on this host through shared memory. Sends go into
// this rank's ring in the peer's segment, receives come from the peer's ring in this rank's
// segment; each side rings the other's doorbell only when it sleeps (Note [Doorbell ordering]).
// Created by Mesh::connect; used by the background thread (Comm::exchange). Segments belong to
// the Mesh and outlive the pair.
#pragma once

#include "transport/pair.h"
#include "transport/shm/segment.h"

namespace hvd::transport::shm {

class ShmPair : public Pair {
 public:
  // outgoing: ring in the peer's segment; incoming: ring in ours. peer_doorbell: the peer's;
  // own_doorbell: this rank's, which Comm waits on. socket_fd: the authenticated TCP socket to
  // the peer (owned by the Mesh), which carries only wake bytes for poll sleeps.
  ShmPair(int peer, Ring outgoing, Ring incoming, Doorbell* peer_doorbell,
          Doorbell* own_doorbell, int socket_fd)
      : peer_(peer), outgoing_(outgoing), incoming_(incoming), peer_doorbell_(peer_doorbell),
        own_doorbell_(own_doorbell), socket_fd_(socket_fd) {}

  PairKind kind() const override { return PairKind::kShm; }
  int peer() const override { return peer_; }
  common::Status sendSome(const uint8_t* data, size_t n, size_t* moved) override;
  common::Status recvSome(uint8_t* data, size_t n, size_t* moved) override;
  int pollFd() const override { return -1; }

  // For the doorbell re-check (seq_cst loads): could a send / receive progress now?
  bool canSend() const { return outgoing_.hasSpace(); }
  bool canRecv() const { return incoming_.hasData(); }
  Doorbell* ownDoorbell() const { return own_doorbell_; }
  int wakeFd() const { return socket_fd_; }  // poll for POLLIN during a poll sleep

 private:
  int peer_;
  Ring outgoing_;
  Ring incoming_;
  Doorbell* peer_doorbell_;
  Doorbell* own_doorbell_;
  int socket_fd_;
};

}  // namespace hvd::transport::shm
