// CollectiveSync (transport/shm/collective_sync.h).
//
// waitAll() and waitFor() follow Note [Exchange progress] with counters in place of transfers:
//   A. Every other local rank has passed the milestone: return.
//   B. Spin for at most HVD_SPIN_US with a pause instruction, re-checking A.
//   C. Abort -> kAborted; a hung-up peer socket (checked at most every 20 ms, and only after one
//      more look at the counters, so a peer that published and then exited is not an error)
//      -> kPeerLost naming it; no counter of any other local rank moved for HVD_TIMEOUT ->
//      kTimeout naming the rank furthest behind.
//   D. Sleep one slice of <= 50 ms on this rank's collective doorbell (Note [Doorbell
//      ordering]: the re-check reads the counters with seq_cst loads, publish() stores them
//      seq_cst before it looks at the peers' sleeping flags), then go to A.
// Abort rings this rank's collective doorbell (Mesh::abort), so D ends at once.
#include "common/cpu_relax.h"
#include "transport/shm/collective_sync.h"

#include <chrono>

#include "common/text.h"
#include "transport/mesh.h"

namespace hvd::transport::shm {

using common::Status;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kSliceMicroseconds = 50 * 1000;
constexpr int64_t kBacklogSliceMicroseconds = 200;
constexpr auto kLivenessInterval = std::chrono::milliseconds(20);

}  // namespace

CollectiveSegment* CollectiveSync::segmentFor(const Comm& comm) {
  const Mesh& mesh = comm.mesh();
  CollectiveSegment* segment = mesh.collectiveSegment();
  if (segment == nullptr) return nullptr;
  // localMembers() are the members on this host, so equal counts mean the comm has them all.
  return comm.localMembers().size() == mesh.hostRanks().size() ? segment : nullptr;
}

CollectiveSync::CollectiveSync(const Comm& comm, CollectiveSegment* segment)
    : comm_(comm), segment_(*segment), size_(segment->localSize()), index_(-1),
      own_doorbell_(nullptr) {
  index_ = comm.mesh().hostIndexOf(comm.mesh().rank());
  own_doorbell_ = segment_.doorbell(index_);
}

int CollectiveSync::globalRankOf(int local) const {
  return comm_.mesh().hostRanks()[static_cast<size_t>(local)];
}

int CollectiveSync::localIndexOf(int global_rank) const {
  return comm_.mesh().hostIndexOf(global_rank);
}

uint64_t CollectiveSync::released() const {
  return segment_.counter(index_, Stage::kReleased).load(std::memory_order_relaxed);
}

void CollectiveSync::publish(std::initializer_list<Stage> stages, uint64_t value) {
  for (Stage stage : stages) {
    segment_.counter(index_, stage).store(value, std::memory_order_seq_cst);
  }
  for (int j = 0; j < size_; ++j) {
    if (j != index_) wakeIfSleeping(segment_.doorbell(j), -1);  // futex sleeps only
  }
}

int CollectiveSync::firstBehind(Stage stage, uint64_t value, int from, int only) const {
  if (only >= 0) {
    return segment_.counter(only, stage).load(std::memory_order_seq_cst) < value ? only : -1;
  }
  for (int k = 0; k < size_; ++k) {
    const int j = (from + k) % size_;
    if (j != index_ && segment_.counter(j, stage).load(std::memory_order_seq_cst) < value) {
      return j;
    }
  }
  return -1;
}

// The rank that passed the fewest milestones: the one the others are stuck behind (a rank
// blocked on it has passed at least as many).
int CollectiveSync::laggard() const {
  int worst = -1;
  uint64_t least = 0;
  for (int j = 0; j < size_; ++j) {
    uint64_t passed = 0;
    for (int k = 0; k < kStageCount && j != index_; ++k) {
      passed += segment_.counter(j, static_cast<Stage>(k)).load(std::memory_order_relaxed);
    }
    if (j != index_ && (worst < 0 || passed < least)) {
      worst = j;
      least = passed;
    }
  }
  return worst;
}

Status CollectiveSync::lostPeer(int global_rank) const {
  const PeerInfo& info = comm_.mesh().peerInfo(global_rank);
  common::Text os;
  os << "lost connection to rank " << global_rank << " (host " << info.host_id << ", pid "
     << info.pid << "): the process exited or closed the connection";
  return common::peerLost(os.str());
}

bool CollectiveSync::hostOutnumbered() const { return comm_.mesh().hostOutnumbered(); }

uint64_t CollectiveSync::progressMark() const {
  uint64_t mark = 0;
  for (int j = 0; j < size_; ++j) {
    for (int k = 0; k < kStageCount && j != index_; ++k) {
      mark += segment_.counter(j, static_cast<Stage>(k)).load(std::memory_order_relaxed);
    }
  }
  return mark;
}

Status CollectiveSync::waitUntil(Stage stage, uint64_t value, int only) {
  int behind = firstBehind(stage, value, 0, only);  // A
  if (behind < 0) return Status::ok();
  const Mesh& mesh = comm_.mesh();
  const auto spin = std::chrono::microseconds(comm_.spinMicroseconds());
  const auto timeout = std::chrono::duration<double>(comm_.timeoutSeconds());
  auto last_progress = Clock::now();
  auto last_liveness_check = last_progress;
  uint64_t seen = progressMark();
  while (true) {
    const auto spin_end = Clock::now() + spin;  // B
    while (behind >= 0 && Clock::now() < spin_end) {
      common::spinPause(mesh.spinYields());
      behind = firstBehind(stage, value, behind, only);
    }
    if (behind < 0) return Status::ok();
    if (mesh.aborted()) return common::aborted("aborted");  // C
    const auto now = Clock::now();
    const uint64_t mark = progressMark();
    if (mark != seen) {
      seen = mark;
      last_progress = now;
    }
    if (now - last_liveness_check >= kLivenessInterval) {
      last_liveness_check = now;
      const int lost = mesh.findLostPeer();
      if (lost >= 0) {
        behind = firstBehind(stage, value, behind, only);
        return behind < 0 ? Status::ok() : lostPeer(lost);
      }
    }
    if (now - last_progress >= timeout) {
      common::Text os;
      os << "timed out after " << comm_.timeoutSeconds() << " s waiting for rank "
         << mesh.hostRanks()[only >= 0 ? only : laggard()] << " over shm (host collective)";
      return common::timedOut(os.str());
    }
    // Frames left in this rank's control outbox may be what the peer waits for (a response):
    // flush them, and look again soon while some remain (Note [Control over shm] C).
    const bool backlog = comm_.mesh().flushControl();
    waitDoorbell(own_doorbell_,  // D
                 [&] { return mesh.aborted() || firstBehind(stage, value, behind, only) < 0; },
                 backlog ? kBacklogSliceMicroseconds : kSliceMicroseconds);
    behind = firstBehind(stage, value, behind, only);
    if (behind < 0) return Status::ok();
  }
}

}  // namespace hvd::transport::shm
