// The shared-memory offer: what one rank tells another over their authenticated data socket
// before either maps the other's memory — a segment's name and its shape, or "nothing". The
// one wire format of the pair setup (Note [Shm setup], setup.cc) and the host collective
// setup (Note [Collective setup], collective_segment.cc), told apart by their magic. Called on
// the bootstrap thread by Mesh::connect only.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "transport/tcp/socket.h"

namespace hvd::transport::shm {

constexpr uint32_t kPairOfferMagic = 0x53445648;        // "HVDS"
constexpr uint32_t kCollectiveOfferMagic = 0x43445648;  // "HVDC"

// Wire, little endian: u32 magic, u8 ok, u8 name length, u16 0, u32 index, u32 count,
// u32 depth, u32 0, u64 bytes, then the name. Fields a setup does not use are 0.
struct Offer {
  bool ok = false;     // false: the sender has no segment for the receiver (offers nothing)
  uint32_t index = 0;  // pair: the ring of the segment the receiver writes into
  uint32_t count = 0;  // pair: rings in the segment; collective: ranks of the host
  uint32_t depth = 0;  // collective: slots per rank
  uint64_t bytes = 0;  // pair: bytes per ring; collective: bytes per chunk
  std::string name;    // the segment's name (segmentName); empty when !ok
};

// A fresh name for a segment this rank creates: "/hvd-<job>-<tag><rank>-<nonce>", the job id
// cut to 24 characters of [A-Za-z0-9_-] (others become '_'), the nonce 8 random bytes in hex.
std::string segmentName(const std::string& job_id, char tag, int rank);

common::Status writeOffer(int fd, uint32_t magic, const Offer& offer, tcp::Deadline deadline);

// Reads one offer. Another magic, or an ok offer whose name is not one segmentName makes
// ("/hvd-" and no other '/'), is an error: the peer is confused or hostile. The fields are
// the caller's to check against what it expects.
common::Status readOffer(int fd, uint32_t magic, tcp::Deadline deadline, Offer* offer);

}  // namespace hvd::transport::shm
