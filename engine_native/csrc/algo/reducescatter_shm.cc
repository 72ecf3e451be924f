// Shared-memory reduce-scatter among the L ranks of one host, through the host collective
// segment (transport/shm/collective_segment.h), as issue #20 asks: each rank writes the blocks
// it contributes to others once, and every rank reads and reduces only its own block.
//
// Derivation. The input (S elements, the same layout on every rank) is cut into L blocks,
// block b (counts[b] elements, zero included) owned by set rank b. Each block is cut into
// pieces of P elements; chunk k is piece k of every block and goes through slot k % depth of
// each rank's segment area, the piece of block b at offset (local index of b)·P. Per chunk,
// rank i:
//   post    copies piece k of every block b != i from its input into its slot
//   reduce  folds piece k of its own block from the L-1 other slots and its own input into
//           its output, in the ring's order (below), then releases the chunk
// Per rank: S - B_i copied in, (L-1)·B_i read out of shared memory and reduced, B_i written;
// the input is never written (the ring reduces in a scratch copy of all S elements) and no
// byte crosses a socket. The ring (algo/reducescatter_ring.cc) moves (L-1)/L·S through L-1
// hops, each a copy into a pair buffer and out of it plus one wake-up per hop and segment.
//
// Note [Reduce-scatter fold order]. The ring leaves block b on rank b as
// x_b op (x_{b-1} op (... op (x_{b+2} op x_{b+1}))) over set ranks mod n: the block starts raw
// on rank b+1 and each next rank folds its own values in. This fold starts from x_{b+1} and
// folds x_{b+2}, ..., x_b into it in that order. Every op the core reduces with (sum, min, max,
// product, in float or integer, half types through float) is commutative bit for bit on
// non-NaN values, so both give the same bits: HVD_TRANSPORT=tcp (the ring) and this path agree
// exactly, as tests/multiproc/test_host_alltoall_reducescatter.py checks. Prescale is applied
// by the caller to a copy before either, postscale after (Note [Reducescatter scaling]).
//
// Pipelining (Note [Host pipeline] in algo/allreduce_shm.cc, walked by algo/segment_walk.h):
// step t posts chunk t and reduces chunk t-1. post(k) waits until every other rank released
// chunk k - depth (rule 2); reduce(k) until every other rank posted k (rule 3). All ranks run
// ceil(max_b B_b / P) chunks (the counts are the same everywhere), posting empty pieces past
// a block's end, so the counters end the op equal (rule 1). P fills the slot's share
// (256 KiB) for large blocks, but a block gets at least 8 pieces (down to 16 KiB, even where
// the host's cores are shared: Note [Piece size]).
//
// Prediction (2-core AMD VM, float32, pooled output, written before measuring): np=2, 16 MiB
// input: 8 MiB copied in, 8 MiB read and summed, 8 MiB written per rank, 32 chunks of 2
// milestones: ≈ 4-7 ms (the ring: a 16 MiB scratch copy, 8 MiB through the pair, a sum: the
// issue measured 0.33-0.56x MPICH). np=4, 16 MiB: 12 MiB in, 12 MiB read and summed, 4 MiB
// out, two ranks per core: ≈ 10-15 ms. 4 B: one post, one wait, one fold.
// The prediction held, and large ops beat MPICH (benchmarks/history/RESULTS-parts-1-10.md,
// "The other collectives and sparse gradients (issue #20, part 2)"; today's figures:
// RESULTS.md, "The other collectives"); 4 B as the shm alltoall: the per-op path's two modes.
#include <algorithm>
#include <cstring>

#include "algo/algorithms.h"
#include "algo/ring_util.h"
#include "algo/segment_walk.h"
#include "transport/shm/collective_sync.h"

namespace hvd::algo {
namespace {

using transport::shm::CollectiveSync;

class HostReduceScatter {
 public:
  HostReduceScatter(CollectiveSync& sync, const transport::Comm& comm, const uint8_t* in,
                    uint8_t* out, const std::vector<size_t>& counts, common::DataType dtype,
                    common::ReduceOp op);
  // SegmentWalk's two stages: post chunk t, reduce chunk t-1.
  common::Status run() {
    return walk_.run([this](uint64_t k) { post(k); }, [this](uint64_t k) { reduce(k); });
  }

 private:
  // Elements of piece k of set rank b's block.
  size_t pieceCount(int b, uint64_t k) const {
    return walk_.pieceLength(blockSize(blocks_, b), k);
  }
  // Where piece k of set rank b's block lies in local rank j's slot.
  uint8_t* inSlot(int j, int b, uint64_t k) const {
    return walk_.slot(j, k) + local_[static_cast<size_t>(b)] * piece_ * esize_;
  }
  void post(uint64_t k);
  void reduce(uint64_t k);

  const uint8_t* const in_;
  uint8_t* const out_;
  const common::DataType dtype_;
  const common::ReduceOp op_;
  const size_t esize_;
  const int me_;                // set rank
  const int me_local_;          // its local index (its slot)
  const int n_;
  BlockOffsets blocks_;         // in elements, by set rank
  std::vector<size_t> local_;   // by set rank: its local index (its slot)
  SegmentWalk walk_;
  const size_t piece_;          // elements
};

HostReduceScatter::HostReduceScatter(CollectiveSync& sync, const transport::Comm& comm,
                                     const uint8_t* in, uint8_t* out,
                                     const std::vector<size_t>& counts, common::DataType dtype,
                                     common::ReduceOp op)
    : in_(in), out_(out), dtype_(dtype), op_(op), esize_(common::dataTypeSize(dtype)),
      me_(comm.rank()), me_local_(sync.index()), n_(comm.size()),
      blocks_(prefixBlocks(counts)), local_(counts.size(), 0),
      walk_(sync, *std::max_element(counts.begin(), counts.end()), esize_,
            static_cast<size_t>(sync.segment().chunkBytes()) / static_cast<size_t>(n_),
            /*writer=*/-1, /*folds=*/true),
      piece_(walk_.piece()) {
  for (int r = 0; r < n_; ++r) {
    local_[static_cast<size_t>(r)] = static_cast<size_t>(sync.localIndexOf(comm.globalRank(r)));
  }
}

void HostReduceScatter::post(uint64_t k) {
  for (int b = 0; b < n_; ++b) {
    const size_t count = pieceCount(b, k);
    if (b == me_ || count == 0) continue;
    std::memcpy(inSlot(me_local_, b, k),
                in_ + (blocks_[static_cast<size_t>(b)] + k * piece_) * esize_, count * esize_);
  }
}

void HostReduceScatter::reduce(uint64_t k) {
  const size_t count = pieceCount(me_, k);
  if (count == 0) return;
  // Note [Reduce-scatter fold order]: x_{me+1}, then x_{me+2}, ..., x_me.
  uint8_t* const to = out_ + k * piece_ * esize_;
  const uint8_t* const own = in_ + (blocks_[static_cast<size_t>(me_)] + k * piece_) * esize_;
  auto source = [&](int b) {
    return b == me_ ? own : inSlot(static_cast<int>(local_[static_cast<size_t>(b)]), me_, k);
  };
  std::memcpy(to, source((me_ + 1) % n_), count * esize_);
  for (int step = 2; step <= n_; ++step) {
    common::reduceInto(to, source((me_ + step) % n_), count, dtype_, op_);
  }
}

}  // namespace

common::Status reducescatterShm(transport::Comm& comm, const void* in, void* out,
                                const std::vector<size_t>& counts, common::DataType dtype,
                                common::ReduceOp op) {
  HVD_RETURN_IF_ERROR(common::checkReducible(dtype, op));
  if (counts.size() != static_cast<size_t>(comm.size())) {
    return common::invalidArgument("reducescatter: " + std::to_string(counts.size()) +
                                   " counts given for a process set of " +
                                   std::to_string(comm.size()) + " ranks");
  }
  transport::shm::CollectiveSegment* segment = CollectiveSync::segmentFor(comm);
  if (segment == nullptr || static_cast<int>(comm.localMembers().size()) != comm.size()) {
    return common::internalError("shm reducescatter: no host collective segment serves this "
                                 "process set of " + std::to_string(comm.size()) + " ranks");
  }
  CollectiveSync sync(comm, segment);
  HostReduceScatter scatter(sync, comm, static_cast<const uint8_t*>(in),
                            static_cast<uint8_t*>(out), counts, dtype, op);
  return scatter.run();
}

}  // namespace hvd::algo
