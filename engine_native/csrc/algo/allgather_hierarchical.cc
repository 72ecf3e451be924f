// Hierarchical allgather for a Comm that spans several hosts, one of them with several members
// (hierarchicalHelps), whose hosts hold consecutive set ranks in global-rank order
// (hostsContiguous): then a host's parts form one contiguous block of the output, and the
// output can be built block by block.
//
// Derivation. Host h holds set ranks [f_h, f_h + L_h); its block B_h is their parts, S_h bytes.
//   A. Every host: allgather of its members' parts into B_h of every member's output, through
//      its collective segment when it serves the host (algo/allgather_shm.cc), else its ring.
//   B. Leaders only (each host's first member): ring allgather of the blocks B_h over the
//      leaders, in place in the leader's output (algo/allgather_ring.cc).
//   C. Every host with several members: broadcast of the whole output from its leader
//      (algo/broadcast_shm.cc, or the tree over its pairs).
// Cross-host bytes: every leader receives S - S_h once; the flat ring sends every rank
// S - S_r, most of it between hosts. C re-sends the host's own block too (S_h, one copy per
// member): simpler than two broadcasts around it, and within a host.
// A and C involve one host only and B the leaders only; members wait in C for a leader that
// finished B. Every rank of a host takes part in that host's A and C, so the segment's
// counters move alike on all of them (Note [Host pipeline], rule 1). The pick (algo/
// allgather.cc) depends only on the Comm's hosts, the same on every rank.
#include <algorithm>
#include <cstring>

#include "algo/algorithms.h"
#include "algo/host_layout.h"
#include "algo/ring_util.h"
#include "transport/shm/collective_sync.h"

namespace hvd::algo {
namespace {

int setRankOf(const transport::Comm& comm, int global_rank) {
  for (int r = 0; r < comm.size(); ++r) {
    if (comm.globalRank(r) == global_rank) return r;
  }
  return -1;
}

}  // namespace

bool hostsContiguous(const transport::Comm& comm) {
  const HostLayout layout = layoutOf(comm);
  int next = 0;
  for (const std::vector<int>& host : layout.hosts) {
    for (int g : host) {
      if (comm.globalRank(next++) != g) return false;
    }
  }
  return true;
}

common::Status allgatherHierarchical(transport::Comm& comm, const void* in, void* out,
                                     const std::vector<size_t>& bytes_per_rank) {
  const HostLayout layout = layoutOf(comm);
  if (layout.my_host < 0) return common::internalError("hierarchical allgather: rank not found");
  const BlockOffsets offsets = prefixBlocks(bytes_per_rank);
  uint8_t* const output = static_cast<uint8_t*>(out);
  std::vector<size_t> host_bytes;  // S_h, hosts in set-rank order
  std::vector<int> leaders;
  for (const std::vector<int>& host : layout.hosts) {
    const size_t first = static_cast<size_t>(setRankOf(comm, host[0]));
    host_bytes.push_back(offsets[first + host.size()] - offsets[first]);
    leaders.push_back(host[0]);
  }
  const std::vector<int>& mine = layout.hosts[layout.my_host];
  const size_t first = static_cast<size_t>(setRankOf(comm, mine[0]));
  uint8_t* const block = output + offsets[first];
  transport::Comm local = subComm(comm, mine);
  const bool segment = transport::shm::CollectiveSync::segmentFor(local) != nullptr;
  const std::vector<size_t> local_bytes(bytes_per_rank.begin() + first,
                                        bytes_per_rank.begin() + first + mine.size());
  if (mine.size() > 1) {  // A
    HVD_RETURN_IF_ERROR(segment ? allgatherShm(local, in, block, local_bytes, false)
                                : allgatherRing(local, in, block, local_bytes));
  } else if (local_bytes[0] > 0 && in != block) {
    std::memmove(block, in, local_bytes[0]);
  }
  if (layout.my_local == 0) {  // B
    transport::Comm cross = subComm(comm, leaders);
    HVD_RETURN_IF_ERROR(allgatherRing(cross, block, output, host_bytes));
  }
  const size_t total = offsets[bytes_per_rank.size()];
  if (mine.size() < 2 || total == 0) return common::Status::ok();
  if (segment) {  // C
    return broadcastShm(local, output, output, total, 0, transport::shm::SingleCopyScope::kEveryOp);
  }
  return broadcastTree(local, output, total, 0);
}

}  // namespace hvd::algo
