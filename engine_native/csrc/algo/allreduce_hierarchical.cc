// Hierarchical allreduce: within each host, across hosts, within each host again.
//
// Derivation. The Comm's n members sit on H hosts; host h has L_h of them (ordered by global
// rank: local index l). Intra-host traffic uses the host collective segment when the Comm
// holds every rank of the host (algo/allreduce_shm.cc), else the shm/tcp pairs (ring phases).
//  Even hosts (every L_h = L >= 2), three phases:
//   1. intra-host reduce-scatter: the buffer is cut into L blocks; local rank l ends with
//      block l reduced over its host. Each rank sends (L-1)/L·S within the host.
//   2. L concurrent inter-host rings: local rank l of every host allreduces block l (S/L
//      bytes) with its H-1 counterparts: 2(H-1)/H·S/L bytes each way per rank over TCP.
//   3. intra-host allgather: every rank collects the other L-1 reduced blocks.
//   Every rank (not one leader per host) carries a share of the cross-host traffic, so a
//   host's NICs/cores are all busy: per host 2(H-1)/H·S bytes leave, the optimum.
//  Uneven hosts (e.g. 2/1/2 ranks), leader-based:
//   1. intra-host allreduce (segment or ring);  2. ring allreduce among the H leaders (local
//   rank 0 of each host) on the whole buffer;  3. broadcast from the leader within the host.
//   The leaders carry 2(H-1)/H·S each way across hosts; the other ranks only intra-host.
// Every block is reduced by exactly one rank in each phase, so every rank ends with the same
// bits.
//
// Prediction (one 2-core machine, hosts faked with HVD_HOSTNAME, so "inter-host" is loopback
// TCP): 2 hosts x 2 ranks, 64 MiB: phase 1 and 3 cost what the shm pipeline's halves cost
// (~40 ms together with 4 ranks on 2 cores), phase 2 moves S/2·2·1/2 = 16 MiB each way per
// rank over TCP (~15-25 ms at ~1 GB/s loopback with 4 ranks on 2 cores), so ≈ 60 ms, busbw
// ≈ 1.7 GB/s, against the flat TCP ring's 2·3/4·S = 96 MiB per rank.
// Measured there (hosts a,a,b,b) it beat the flat ring in time and in CPU per rank
// (benchmarks/history/RESULTS-parts-1-10.md, "Core allreduce: shared-memory segment vs ring"),
// and over network namespaces too (benchmarks/RESULTS.md, "Multi-host over network
// namespaces"). Loopback "inter-host" TCP is cheap; across real hosts the gain is larger.
//
// Pipelining: inside each phase (the host pipeline's chunks, the ring's segments); the
// phases themselves run one after another.
#include <vector>

#include "algo/algorithms.h"
#include "algo/host_layout.h"
#include "algo/ring_util.h"
#include "transport/shm/collective_sync.h"

namespace hvd::algo {
namespace {

// Even hosts: phases 1-3 of the derivation, block l on local rank l.
common::Status evenHosts(const transport::Comm& comm, const HostLayout& layout,
                         const AllreduceOptions& opts) {
  const std::vector<int>& mine = layout.hosts[layout.my_host];
  transport::Comm local = subComm(comm, mine);
  const int l = layout.my_local;
  const BlockOffsets blocks = evenBlocks(opts.count, static_cast<int>(mine.size()));
  HVD_RETURN_IF_ERROR(hostBlocksReduceScatter(local, opts.data, opts.count, opts.dtype, opts.op,
                                              opts.segment_bytes));
  std::vector<int> peers;  // local rank l of every host
  for (const std::vector<int>& host : layout.hosts) peers.push_back(host[l]);
  transport::Comm cross = subComm(comm, peers);
  AllreduceOptions shard = opts;
  shard.data = static_cast<uint8_t*>(opts.data) + blocks[l] * common::dataTypeSize(opts.dtype);
  shard.count = blockSize(blocks, l);
  HVD_RETURN_IF_ERROR(allreduceRing(cross, shard));
  return hostBlocksAllgather(local, opts.data, opts.count, opts.dtype);
}

// Uneven hosts: host allreduce, leaders' ring, host broadcast (through the segment when it
// serves the host, as phase 1).
common::Status unevenHosts(const transport::Comm& comm, const HostLayout& layout,
                           const AllreduceOptions& opts) {
  const std::vector<int>& mine = layout.hosts[layout.my_host];
  transport::Comm local = subComm(comm, mine);
  const bool several = mine.size() > 1;
  const bool segment = transport::shm::CollectiveSync::segmentFor(local) != nullptr;
  if (several) {
    HVD_RETURN_IF_ERROR(segment ? allreduceShm(local, opts) : allreduceRing(local, opts));
  }
  if (layout.my_local == 0) {
    std::vector<int> leaders;
    for (const std::vector<int>& host : layout.hosts) leaders.push_back(host[0]);
    transport::Comm cross = subComm(comm, leaders);
    HVD_RETURN_IF_ERROR(allreduceRing(cross, opts));
  }
  if (!several) return common::Status::ok();
  // The leader is local rank 0, which is set rank 0 of `local` (members in global order).
  const size_t bytes = opts.count * common::dataTypeSize(opts.dtype);
  if (segment) {
    return broadcastShm(local, opts.data, opts.data, bytes, 0,
                        transport::shm::SingleCopyScope::kEveryOp);
  }
  return broadcastTree(local, opts.data, bytes, 0);
}

}  // namespace

bool hierarchicalHelps(const transport::Comm& comm) {
  const HostLayout layout = layoutOf(comm);
  if (layout.hosts.size() < 2) return false;
  for (const std::vector<int>& host : layout.hosts) {
    if (host.size() > 1) return true;
  }
  return false;
}

common::Status allreduceHierarchical(transport::Comm& comm, const AllreduceOptions& opts) {
  HVD_RETURN_IF_ERROR(common::checkReducible(opts.dtype, opts.op));
  if (opts.count == 0 || comm.size() == 1) return common::Status::ok();
  if (opts.data == nullptr) return common::invalidArgument("allreduce: null data buffer");
  const HostLayout layout = layoutOf(comm);
  if (layout.my_host < 0) return common::internalError("hierarchical allreduce: rank not found");
  return layout.even ? evenHosts(comm, layout, opts) : unevenHosts(comm, layout, opts);
}

}  // namespace hvd::algo
