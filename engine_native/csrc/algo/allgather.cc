// allgather(): picks the allgather algorithm for one op.
//
// Derivation of the pick (the first that applies wins):
//   1. shm: several members, all on this host, and the host collective segment serves the Comm
//      (all of the host's ranks are in it; not HVD_TRANSPORT=tcp): each rank writes its part
//      once and reads the others' (algo/allgather_shm.cc).
//   2. hierarchical: several hosts, one with several members, each host's members consecutive
//      set ranks: within hosts, leaders' ring, host broadcast (algo/allgather_hierarchical.cc).
//   3. ring: over any pairs, shm or tcp (algo/allgather_ring.cc).
// The inputs (choice, membership, whether the host's ranks agreed on a segment) are the same
// on every rank of the Comm, so all ranks pick alike (Note [Collective setup]).
#include "algo/algorithms.h"
#include "common/logging.h"
#include "transport/shm/collective_sync.h"

namespace hvd::algo {

bool hostSegmentServes(const transport::Comm& comm, const AllreduceChoice& choice) {
  return comm.size() > 1 && static_cast<int>(comm.localMembers().size()) == comm.size() &&
         choice.shared_memory && transport::shm::CollectiveSync::segmentFor(comm) != nullptr;
}

void logCollectivePick(CopyCollective op, CopyPath path, const transport::Comm& comm) {
  static bool logged[4][3] = {};  // [op][path], once per process
  bool& done = logged[static_cast<int>(op)][static_cast<int>(path)];
  if (done) return;
  done = true;
  static const char* const kOps[4] = {"allgather", "broadcast", "alltoall", "reducescatter"};
  static const char* const kPairs[4] = {"ring (pairs)", "tree (pairs)", "pairwise (pairs)",
                                        "ring (pairs)"};
  const bool broadcast = op == CopyCollective::kBroadcast;
  const char* name = "shm (host collective segment)";
  if (path == CopyPath::kPairs) name = kPairs[static_cast<int>(op)];
  if (path == CopyPath::kHierarchical) {
    name = broadcast ? "hierarchical (leaders' tree, then each host)"
                     : "hierarchical (each host, leaders' ring, each host)";
  }
  HVD_LOG(kInfo, "algo") << kOps[static_cast<int>(op)] << " via " << name
                         << " (process set of " << comm.size() << ", "
                         << comm.localMembers().size() << " on this host)";
}

common::Status allgather(transport::Comm& comm, const void* in, void* out,
                         const std::vector<size_t>& bytes_per_rank,
                         const AllreduceChoice& choice, bool out_shared) {
  if (bytes_per_rank.size() != static_cast<size_t>(comm.size())) {
    return allgatherRing(comm, in, out, bytes_per_rank);  // reports the mismatch
  }
  const bool shm = hostSegmentServes(comm, choice);
  const bool one_host = static_cast<int>(comm.localMembers().size()) == comm.size();
  if (!shm && !one_host && hierarchicalHelps(comm) && hostsContiguous(comm)) {
    logCollectivePick(CopyCollective::kAllgather, CopyPath::kHierarchical, comm);
    return allgatherHierarchical(comm, in, out, bytes_per_rank);
  }
  if (comm.size() > 1) {
    logCollectivePick(CopyCollective::kAllgather, shm ? CopyPath::kShm : CopyPath::kPairs, comm);
  }
  if (shm) return allgatherShm(comm, in, out, bytes_per_rank, out_shared);
  return allgatherRing(comm, in, out, bytes_per_rank);
}

}  // namespace hvd::algo
