// Mesh: the job's connections, one per peer, owned by the background thread after connect().
// Step A (Python bootstrap thread): listen() binds a socket and reports the port.
// Step B (same thread): connect() dials/accepts every peer (lower rank accepts, higher rank
// dials), proves the job secret both ways (HMAC-SHA256 challenge), opens a control channel
// to rank 0 for every worker, and maps shared memory for peers on the same host.
// After connect() the Mesh belongs to the background thread (plus abort(), which is atomic).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/cpu_ranges.h"
#include "common/status.h"
#include "transport/control.h"
#include "transport/pair.h"
#include "transport/peer_channel.h"

namespace hvd::transport {

namespace shm {
class CollectiveSegment;
}

struct PeerInfo {
  std::string host_id;   // ranks with equal host_id share a host (shm, local_rank)
  std::string address;   // where the peer's listener is reachable
  int port = 0;
  int64_t pid = 0;
  std::string machine_id;  // ranks with equal machine_id share one kernel's CPUs (boot id)
  std::string pid_namespace;  // "pid:[inode]" ("": unknown); `pid` means a process where equal
  common::CpuRanges cpus;  // the CPUs it may run on (common::processCpuMask); empty: unknown
};

class Mesh {
 public:
  Mesh();
  ~Mesh();

  common::Status listen(const std::string& bind_address, int* port);
  common::Status connect(int rank, const std::vector<PeerInfo>& peers, const std::string& secret,
                         const std::string& job_id, const common::Config& config);

  int rank() const { return rank_; }
  int size() const { return static_cast<int>(peers_.size()); }
  // Data pair to a peer (nullptr for self). "shm" or "tcp" by Pair::kind().
  Pair* pair(int global_rank) const;

  const PeerInfo& peerInfo(int global_rank) const { return peers_[global_rank]; }
  bool sameHost(int a, int b) const { return peers_[a].host_id == peers_[b].host_id; }
  // The global ranks of this rank's host, ascending (self included), and the segment they all
  // mapped for host collectives (shm/collective_segment.h), or nullptr when they did not.
  const std::vector<int>& hostRanks() const;
  // The position of global `rank` in hostRanks() (its local index), or -1 on another host.
  int hostIndexOf(int rank) const;
  shm::CollectiveSegment* collectiveSegment() const;
  // The largest op the one-round board carries, the least every rank of the world asked for
  // (0: no board; Note [One round] K in runtime/one_round.cc). Fixed at connect().
  uint32_t oneRoundBytes() const;
  // This host's ranks outnumber the cores this process may use, or this machine's ranks its
  // CPUs (overlapping, or pinned within them): bounded spins yield the core between polls
  // instead of pausing on it (Note [Yielding spins]). Fixed at connect().
  bool spinYields() const { return spin_yields_; }
  // This machine's ranks whose CPUs overlap this process's outnumber them, or ranks pinned
  // within its CPUs do (common::SpinVerdicts::crowded; Note [CPU binding] C). Fixed at connect().
  bool cpusCrowded() const { return cpus_crowded_; }
  // Some rank of this host's spins yield (spinYields() there), read from the peer table: the
  // same on every rank of the host, so its ranks agree on what depends on it (Note [Yielding
  // spins] C; Note [Piece size] in algo/segment_walk.h). Fixed at connect().
  bool hostOutnumbered() const { return host_outnumbered_; }

  // Control channel (framed messages, see transport/control.h). Rank 0 has one per worker;
  // a worker has one, to rank 0. nullptr when absent.
  ControlChannel* control(int global_rank) const;
  // Point-to-point connection to a peer (nullptr for self, or before connect()).
  PeerChannel* peerChannel(int global_rank) const;
  // Where this rank's loop announces a poll sleep to control channels on shared memory
  // (Note [Control over shm] B); nullptr when no channel is on shared memory. Until close().
  shm::Doorbell* controlDoorbell() const;
  // The same for point-to-point channels on shared memory (Note [Point-to-point over shm] in
  // peer_channel.cc), where a driving caller also says that it reads the rings.
  shm::Doorbell* peerDoorbell() const;
  // Sets or clears a Doorbell::driving bit of that doorbell (kCallerDrives, kCallerSleeps),
  // from a thread that may race close(): nothing once close() began (Note [Abort versus
  // close] in mesh.cc). Under the loop's progress_, which close() also runs under, the
  // doorbell is marked directly (shm::markDriving) without this mutex.
  void markPeerDoorbell(uint32_t bit, bool on);
  // Wakes a caller asleep on this rank's point-to-point doorbell (Note [Caller sleeps on the
  // doorbell]); any thread, nothing once close() began (as markPeerDoorbell).
  void ringPeerDoorbell();
  // Moves control frames a ring had no room for into it (Note [Control over shm] C); true
  // while some remain. Waits inside collectives call it: an agreed op's response may be what
  // the peer this rank waits for still needs. Background thread (or a driving caller) only.
  bool flushControl();
  int listenFd() const { return listen_fd_; }

  // Handle one pending connection on the listener after connect(): a stray or hostile dialer
  // is authenticated or dropped with a log line; never affects the job.
  void acceptStray();

  // Liveness: checks every peer socket for hang-up without consuming data. Returns the first
  // lost peer's rank, or -1.
  int findLostPeer() const;

  // Wakes any wait in this mesh (shm doorbell and the loop's eventfd) and makes every later
  // transfer fail with kAborted. Safe from any thread.
  void abort();
  bool aborted() const { return aborted_.load(std::memory_order_acquire); }

  void close();  // closes sockets, unmaps shm; idempotent

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = -1;
  int listen_fd_ = -1;
  std::vector<PeerInfo> peers_;
  std::atomic<bool> aborted_{false};
  bool spin_yields_ = false;
  bool cpus_crowded_ = false;
  bool host_outnumbered_ = false;
};

}  // namespace hvd::transport
