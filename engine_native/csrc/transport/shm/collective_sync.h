// CollectiveSync: one op's handle on the host collective segment (collective_segment.h) for a
// Comm that includes every rank of this host: this rank's local index, publish() of its chunk
// counters, and waitAll(), which waits until every other rank of the host has passed a
// milestone. Waiting is Comm::exchange's (Note [Exchange progress]): a bounded spin
// (HVD_SPIN_US), then FUTEX_WAIT slices on this rank's collective doorbell, ending with an error
// on abort, a lost peer or HVD_TIMEOUT without progress. Background thread only.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "common/status.h"
#include "transport/comm.h"
#include "transport/shm/collective_segment.h"

namespace hvd::transport::shm {

class CollectiveSync {
 public:
  // The segment serving `comm`, or nullptr: the host has none, or comm leaves out some rank of
  // this host (whose counters would then fall behind: Note [Host pipeline]).
  static CollectiveSegment* segmentFor(const Comm& comm);

  // segment: segmentFor(comm), not null.
  CollectiveSync(const Comm& comm, CollectiveSegment* segment);

  int size() const { return size_; }
  int index() const { return index_; }
  // The local index of a global rank of this host (its place among the host's ranks in
  // global order), or -1 for a rank on another host.
  int localIndexOf(int global_rank) const;
  // The global rank of local index `local` (0 <= local < size()).
  int globalRankOf(int local) const;
  const CollectiveSegment& segment() const { return segment_; }
  // Some rank of this host shares its cores (Mesh::hostOutnumbered): the same on every rank.
  bool hostOutnumbered() const;
  // Chunks this rank has released so far: the first chunk number of the next op.
  uint64_t released() const;

  // Sets this rank's counters for `stages` to `value` and wakes sleeping peers.
  void publish(std::initializer_list<Stage> stages, uint64_t value);
  // Returns once every other local rank's `stage` counter is >= value.
  common::Status waitAll(Stage stage, uint64_t value) { return waitUntil(stage, value, -1); }
  // Returns once local rank `local`'s (not this rank's) `stage` counter is >= value.
  common::Status waitFor(int local, Stage stage, uint64_t value) {
    return waitUntil(stage, value, local);
  }

 private:
  // only < 0: every other local rank; else that one alone.
  common::Status waitUntil(Stage stage, uint64_t value, int only);
  int firstBehind(Stage stage, uint64_t value, int from, int only) const;  // local index or -1
  uint64_t progressMark() const;  // sum of every other rank's counters: moves iff they do
  int laggard() const;            // local index of the other rank with the fewest milestones
  common::Status lostPeer(int global_rank) const;

  const Comm& comm_;
  const CollectiveSegment& segment_;
  int size_;
  int index_;
  Doorbell* own_doorbell_;
};

}  // namespace hvd::transport::shm
