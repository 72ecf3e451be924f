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
  // link: the data rings; its own_doorbell is the one Comm waits on, its socket the
  // authenticated TCP socket to the peer (owned by the Mesh), which carries only wake bytes for
  // poll sleeps.
  ShmPair(int peer, const RingLink& link) : peer_(peer), link_(link) {}

  PairKind kind() const override { return PairKind::kShm; }
  int peer() const override { return peer_; }
  common::Status sendSome(const uint8_t* data, size_t n, size_t* moved) override;
  common::Status recvSome(uint8_t* data, size_t n, size_t* moved) override;
  int pollFd() const override { return -1; }

  // For the doorbell re-check (seq_cst loads): could a send / receive progress now?
  bool canSend() const { return link_.outgoing.hasSpace(); }
  bool canRecv() const { return link_.incoming.hasData(); }
  Doorbell* ownDoorbell() const { return link_.own_doorbell; }
  int wakeFd() const { return link_.socket_fd; }  // poll for POLLIN during a poll sleep

 private:
  int peer_;
  RingLink link_;
};

}  // namespace hvd::transport::shm
