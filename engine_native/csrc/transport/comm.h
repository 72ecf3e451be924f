// Comm: what algorithms see — the members of one process set, addressed by set rank, and one
// blocking primitive, exchange(), that progresses many sends/receives concurrently until all
// complete. Waiting is a bounded spin (HVD_SPIN_US) then a blocking wait (poll on sockets, futex
// on the shm doorbell) in slices, so an abort, a lost peer or HVD_TIMEOUT without progress ends
// it with the peer's rank in the error. Background thread only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/status.h"

namespace hvd::transport {

class Mesh;

struct Transfer {
  int peer = -1;          // set rank
  bool is_send = false;
  void* data = nullptr;   // send: source, recv: destination
  size_t bytes = 0;
  size_t done = 0;        // progressed by exchange()
};

class Comm {
 public:
  // members: global ranks of the process set, in set-rank order; must contain mesh.rank().
  Comm(Mesh& mesh, std::vector<int> members, double timeout_seconds, int64_t spin_microseconds);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(members_.size()); }
  int globalRank(int set_rank) const { return members_[set_rank]; }
  // Peers in the same host as this rank (set ranks), in order; includes self.
  const std::vector<int>& localMembers() const { return local_members_; }
  bool sameHost(int set_rank) const;
  // For host collectives (shm/collective_sync.h), which wait on the same terms as exchange().
  Mesh& mesh() const { return mesh_; }
  double timeoutSeconds() const { return timeout_seconds_; }
  int64_t spinMicroseconds() const { return spin_microseconds_; }

  common::Status exchange(Transfer* transfers, size_t count);
  common::Status send(int peer, const void* data, size_t bytes);
  common::Status recv(int peer, void* data, size_t bytes);

 private:
  Mesh& mesh_;
  std::vector<int> members_;
  std::vector<int> local_members_;
  int rank_ = -1;
  double timeout_seconds_;
  int64_t spin_microseconds_;
};

}  // namespace hvd::transport
