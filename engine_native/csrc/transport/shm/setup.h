// Shared-memory setup between the ranks of one host, run by Mesh::connect on the bootstrap
// thread over the already-authenticated data sockets (Note [Shm setup] in setup.cc). The
// result is handed to the Mesh, which builds one ShmPair per peer where both sides agreed.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/shm/segment.h"
#include "transport/tcp/socket.h"

namespace hvd::transport::shm {

struct SetupRequest {
  int rank = -1;
  std::string job_id;
  std::vector<int> local_peers;  // global ranks with this rank's host id, ascending, not self
  std::vector<int> fds;          // data socket per global rank
  uint64_t ring_bytes = 4 << 20;
  bool wanted = true;            // false when HVD_TRANSPORT=tcp: offer nothing, map nothing
  tcp::Deadline deadline;
};

struct SetupResult {
  std::unique_ptr<Segment> own;                        // null when no peer uses shm
  std::vector<std::unique_ptr<Segment>> peer_segment;  // by global rank; null = no shm pair
  std::vector<uint32_t> incoming_ring;                 // ring index in `own`, by global rank
  std::vector<uint32_t> outgoing_ring;                 // ring index in the peer's segment
};

common::Status setupSharedMemory(const SetupRequest& request, SetupResult* result);

}  // namespace hvd::transport::shm
