// Shared-memory allgather among the L ranks of one host, through the host collective segment
// (transport/shm/collective_segment.h), as issue #20 asks: each rank writes its part once and
// every rank reads what it needs, with no ring of hops.
//
// Derivation. Rank j's part (B_j bytes, any size, zero included) is cut into pieces of P bytes;
// chunk k is piece k of every part and goes through slot k % depth of each rank's own segment
// area (a rank's slot holds its own piece only, so P may be the whole slot: chunk_bytes =
// L x 256 KiB). Per chunk, rank i:
//   post    copies its piece k into its slot and into its own place in the output
//   collect copies piece k of every other rank's part from that rank's slot into the output
// Per rank: B_i read once and written twice, (S - B_i) copied out of shared memory, where
// S = sum of B_j; no byte crosses a socket. The ring (algo/allgather_ring.cc) moved the same
// (S - B_i) through L-1 pairwise hops, each a copy into a pair buffer and a copy out of it,
// with one wake-up per hop and step: (L+1)·S against (2L-1)·S bytes copied per rank at even
// parts, and 2 milestones per chunk against 2(L-1) transfers per ring step.
//
// Pipelining (Note [Host pipeline] in algo/allreduce_shm.cc, walked by algo/segment_walk.h):
// step t posts chunk t and collects chunk t-1, so a rank copies its next piece in while its
// peers still read the last one. post(k) waits until every other rank released chunk
// k - depth (rule 2: the slot is free); collect(k) until every other rank posted k (rule 3).
// Every rank of the host runs the same number of chunks, ceil(max B_j / P), since all see the
// same sizes; a rank whose part ran out posts empty pieces but still publishes, so all
// counters end the op equal (rule 1). Collecting publishes kReduced with kReleased (there is
// no reduction). P is the slot for large parts but at least 8 pieces per part (down to
// 16 KiB, 128 KiB where the host's cores are shared: Note [Piece size]), so that a 1 MiB
// part still overlaps copy-in with copy-out; a part of a few KiB is one chunk: one post, one
// wait, one collect.
//
// Prediction (2-core AMD VM, float32, out freshly allocated by the caller): np=2, 16 MiB per
// rank: 48 MiB copied per rank, slots hot in L2/L3, 32 chunks, ≤ 64 waits (mostly satisfied
// while spinning): ≈ 5-8 ms with the output's page faults (ring: 40 ms, MPICH: 10 ms). np=4
// on 2 cores, 16 MiB: 80 MiB copied per rank, two ranks per core: ≈ 30-40 ms (ring 183 ms,
// MPICH 57 ms). 4 B: one round trip through the counters, ≈ MPICH's.
#include <algorithm>
#include <cstring>
#include <utility>

#include "algo/algorithms.h"
#include "algo/peer_block.h"
#include "algo/ring_util.h"
#include "algo/segment_walk.h"
#include "algo/shared_outputs.h"
#include "algo/single_copy.h"
#include "transport/shm/cross_memory.h"
#include "transport/shm/collective_sync.h"

namespace hvd::algo {
namespace {

using transport::shm::CollectiveSync;

class HostAllgather {
 public:
  HostAllgather(CollectiveSync& sync, const transport::Comm& comm, const uint8_t* in,
                uint8_t* out, const std::vector<size_t>& bytes_per_rank);
  // SegmentWalk's two stages: post chunk t, collect chunk t-1.
  common::Status run() {
    return walk_.run([this](uint64_t k) { post(k); }, [this](uint64_t k) { collect(k); });
  }

 private:
  void post(uint64_t k);
  void collect(uint64_t k);

  const uint8_t* const in_;
  uint8_t* const out_;
  const int me_;
  const int n_;
  std::vector<size_t> part_;     // by local index: that rank's bytes
  std::vector<size_t> offset_;   // by local index: where its part starts in out
  SegmentWalk walk_;
  const size_t piece_;
};

HostAllgather::HostAllgather(CollectiveSync& sync, const transport::Comm& comm,
                             const uint8_t* in, uint8_t* out,
                             const std::vector<size_t>& bytes_per_rank)
    : in_(in), out_(out), me_(sync.index()), n_(sync.size()),
      part_(static_cast<size_t>(n_), 0), offset_(static_cast<size_t>(n_), 0),
      walk_(sync, *std::max_element(bytes_per_rank.begin(), bytes_per_rank.end()), 1,
            static_cast<size_t>(sync.segment().chunkBytes())),
      piece_(walk_.piece()) {
  // Local index j is the host's j-th rank in global order; the output is in set-rank order.
  const BlockOffsets offsets = prefixBlocks(bytes_per_rank);
  for (int r = 0; r < comm.size(); ++r) {
    const size_t j = static_cast<size_t>(sync.localIndexOf(comm.globalRank(r)));
    part_[j] = bytes_per_rank[static_cast<size_t>(r)];
    offset_[j] = offsets[static_cast<size_t>(r)];
  }
}

void HostAllgather::post(uint64_t k) {
  const size_t len = walk_.pieceLength(part_[me_], k);
  if (len == 0) return;
  const uint8_t* const from = in_ + k * piece_;
  uint8_t* const to = out_ + offset_[me_] + k * piece_;
  std::memcpy(walk_.slot(me_, k), from, len);
  if (to != from) std::memmove(to, from, len);
}

void HostAllgather::collect(uint64_t k) {
  for (int j = 0; j < n_; ++j) {
    const size_t len = walk_.pieceLength(part_[j], k);
    if (j == me_ || len == 0) continue;
    std::memcpy(out_ + offset_[j] + k * piece_, walk_.slot(j, k), len);
  }
}

// Note [Single-copy ops] in algo/single_copy.cc: every rank reads every other rank's input
// straight into its place in the output. part/offset: by local index, as HostAllgather's.
common::Status allgatherSingleCopy(CollectiveSync& sync, const uint8_t* in, uint8_t* out,
                                   const std::vector<size_t>& part,
                                   const std::vector<size_t>& offset) {
  const size_t me = static_cast<size_t>(sync.index());
  SingleCopyOp op;
  op.in = in;
  op.bytes = part[me];
  op.local = [&] {
    if (part[me] > 0 && in != out + offset[me]) std::memcpy(out + offset[me], in, part[me]);
  };
  op.read = [&](int j, const PeerInput& peer) {
    const size_t want = part[static_cast<size_t>(j)];
    HVD_RETURN_IF_ERROR(checkPeerBlock("allgather", j, peer.bytes, 0, peer.bytes, want));
    if (want == 0) return common::Status::ok();
    return transport::shm::readPeer(peer.pid, peer.address,
                                    out + offset[static_cast<size_t>(j)], want);
  };
  return runSingleCopy(sync, op);
}

// Note [Shared outputs] in algo/shared_outputs.cc: this rank's part goes straight into every
// rank's output, at the same offset in each.
common::Status allgatherIntoOutputs(CollectiveSync& sync, const transport::Comm& comm,
                                    const uint8_t* in, uint8_t* out,
                                    const std::vector<size_t>& bytes_per_rank, bool* use_slots) {
  const BlockOffsets offsets = prefixBlocks(bytes_per_rank);
  const size_t mine = bytes_per_rank[static_cast<size_t>(comm.rank())];
  SharedOutputOp op;
  op.name = "allgather";
  op.out = out;
  op.out_bytes = offsets.back();
  op.landing.assign(static_cast<size_t>(sync.size()), 0);
  op.expected.assign(op.landing.size(), 0);
  for (int r = 0; r < comm.size(); ++r) {
    const auto j = static_cast<size_t>(sync.localIndexOf(comm.globalRank(r)));
    op.landing[j] = offsets[static_cast<size_t>(r)];
    op.expected[j] = bytes_per_rank[static_cast<size_t>(r)];
  }
  op.block_for = [&](int) { return std::make_pair(in, mine); };
  return runSharedOutputs(sync, op, use_slots);
}

}  // namespace

common::Status allgatherShm(transport::Comm& comm, const void* in, void* out,
                            const std::vector<size_t>& bytes_per_rank, bool out_shared) {
  transport::shm::CollectiveSegment* segment = CollectiveSync::segmentFor(comm);
  if (segment == nullptr || static_cast<int>(comm.localMembers().size()) != comm.size()) {
    return common::internalError("shm allgather: no host collective segment serves this "
                                 "process set of " + std::to_string(comm.size()) + " ranks");
  }
  CollectiveSync sync(comm, segment);
  // Decided before any per-op work: the slot path (the default) pays nothing for it.
  if (comm.size() > 1 &&
      singleCopyServes(sync, *std::max_element(bytes_per_rank.begin(), bytes_per_rank.end()),
                       transport::shm::SingleCopyScope::kEveryOp)) {
    std::vector<size_t> part(static_cast<size_t>(comm.size()), 0);
    std::vector<size_t> offset(part.size(), 0);
    const BlockOffsets offsets = prefixBlocks(bytes_per_rank);
    for (int r = 0; r < comm.size(); ++r) {
      const size_t j = static_cast<size_t>(sync.localIndexOf(comm.globalRank(r)));
      part[j] = bytes_per_rank[static_cast<size_t>(r)];
      offset[j] = offsets[static_cast<size_t>(r)];
    }
    return allgatherSingleCopy(sync, static_cast<const uint8_t*>(in),
                               static_cast<uint8_t*>(out), part, offset);
  }
  if (comm.size() > 1 && out_shared) {
    bool use_slots = false;
    HVD_RETURN_IF_ERROR(allgatherIntoOutputs(sync, comm, static_cast<const uint8_t*>(in),
                                             static_cast<uint8_t*>(out), bytes_per_rank,
                                             &use_slots));
    if (!use_slots) return common::Status::ok();
  }
  HostAllgather gather(sync, comm, static_cast<const uint8_t*>(in), static_cast<uint8_t*>(out),
                       bytes_per_rank);
  return gather.run();
}

}  // namespace hvd::algo
