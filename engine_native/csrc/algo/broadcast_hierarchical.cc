// Hierarchical broadcast for a Comm that spans several hosts, one of them with several members
// (hierarchicalHelps): the message crosses between hosts once per host, then each host shares
// it through its collective segment.
//
// Derivation. A host's leader is the root on the root's host and the host's first member
// (lowest global rank) elsewhere.
//   A. Leaders only: binomial tree / pipelined chain (algo/broadcast_tree.cc) over the leaders
//      from the root: S crosses into every other host once, against the flat tree's S into
//      every rank of every other host ((n - L_root)·S cross-host bytes become (H - 1)·S).
//   B. Every host with several members: broadcast from its leader, through the host collective
//      segment when it serves the host (algo/broadcast_shm.cc: one copy per rank), else the
//      tree over the host's pairs.
// A host's members wait in B for their leader, who finished A first; A involves leaders only
// and B one host only, so no rank waits on another phase's rank. Every rank of a host takes
// part in that host's B, so the segment's counters move alike on all of them (Note [Host
// pipeline], rule 1). The pick (algo/broadcast.cc) depends only on the hosts of the Comm, the
// same on every rank; each host's choice in B depends on its own segment agreement, the same
// on all of that host's ranks (Note [Collective setup]).
//
// Pipelining: inside each phase (the chain's segments, the segment's pieces); A and B run one
// after another, so a member on another host waits for the whole of A.
#include <algorithm>
#include <cstring>

#include "algo/algorithms.h"
#include "algo/host_layout.h"
#include "transport/shm/collective_sync.h"

namespace hvd::algo {

common::Status broadcastHierarchical(transport::Comm& comm, const void* root_in, void* data,
                                     size_t bytes, int root,
                                     transport::shm::SingleCopyScope needs) {
  if (bytes == 0 || comm.size() == 1) return common::Status::ok();
  const HostLayout layout = layoutOf(comm);
  if (layout.my_host < 0) return common::internalError("hierarchical broadcast: rank not found");
  const int root_global = comm.globalRank(root);
  const int me_global = comm.globalRank(comm.rank());
  if (me_global == root_global && root_in != data) std::memcpy(data, root_in, bytes);
  // Each host's leader, and the leaders in set-rank order (the order subComm expects).
  auto leaderOf = [&](const std::vector<int>& host) {
    const bool has_root = std::find(host.begin(), host.end(), root_global) != host.end();
    return has_root ? root_global : host[0];
  };
  std::vector<int> leaders;
  for (int r = 0; r < comm.size(); ++r) {
    for (const std::vector<int>& host : layout.hosts) {
      if (leaderOf(host) == comm.globalRank(r)) leaders.push_back(comm.globalRank(r));
    }
  }
  const std::vector<int>& mine = layout.hosts[layout.my_host];
  const int my_leader = leaderOf(mine);
  if (me_global == my_leader) {  // A
    transport::Comm cross = subComm(comm, leaders);
    const int cross_root = static_cast<int>(
        std::find(leaders.begin(), leaders.end(), root_global) - leaders.begin());
    HVD_RETURN_IF_ERROR(broadcastTree(cross, data, bytes, cross_root));
  }
  if (mine.size() < 2) return common::Status::ok();
  transport::Comm local = subComm(comm, mine);  // B
  const int local_root =
      static_cast<int>(std::find(mine.begin(), mine.end(), my_leader) - mine.begin());
  if (transport::shm::CollectiveSync::segmentFor(local) != nullptr) {
    return broadcastShm(local, data, data, bytes, local_root, needs);
  }
  return broadcastTree(local, data, bytes, local_root);
}

}  // namespace hvd::algo
