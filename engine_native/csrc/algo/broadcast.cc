// broadcast(): picks the broadcast algorithm for one op, as allgather() does (algo/allgather.cc):
//   1. shm: several members, all on this host, served by the host collective segment: the root
//      writes once, every other rank reads once (algo/broadcast_shm.cc).
//   2. hierarchical: several hosts, one with several members (hierarchicalHelps): a tree over
//      one leader per host, then each host from its leader (algo/broadcast_hierarchical.cc).
//   3. tree: binomial tree or pipelined chain over any pairs (algo/broadcast_tree.cc).
// Every input to the pick is the same on every rank of the Comm, so all ranks pick alike.
#include <cstring>

#include "algo/algorithms.h"

namespace hvd::algo {

common::Status broadcast(transport::Comm& comm, const void* root_in, void* data, size_t bytes,
                         int root, const AllreduceChoice& choice) {
  if (root < 0 || root >= comm.size()) return broadcastTree(comm, data, bytes, root);  // error
  const auto needs = choice.pinned_host_buffers ? transport::shm::SingleCopyScope::kEveryOp
                                                : transport::shm::SingleCopyScope::kBroadcast;
  const bool shm = hostSegmentServes(comm, choice);
  const bool one_host = static_cast<int>(comm.localMembers().size()) == comm.size();
  if (!shm && !one_host && hierarchicalHelps(comm)) {
    logCollectivePick(CopyCollective::kBroadcast, CopyPath::kHierarchical, comm);
    return broadcastHierarchical(comm, root_in, data, bytes, root, needs);
  }
  if (comm.size() > 1) {
    logCollectivePick(CopyCollective::kBroadcast, shm ? CopyPath::kShm : CopyPath::kPairs, comm);
  }
  if (shm) return broadcastShm(comm, root_in, data, bytes, root, needs);
  if (comm.rank() == root && root_in != data && bytes > 0) std::memcpy(data, root_in, bytes);
  return broadcastTree(comm, data, bytes, root);
}

}  // namespace hvd::algo
