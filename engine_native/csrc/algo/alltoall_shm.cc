// Shared-memory alltoall among the L ranks of one host, through the host collective segment
// (transport/shm/collective_segment.h), as issue #20 asks: each rank writes each block it sends
// once and every rank reads only the blocks addressed to it, with no pairwise steps.
//
// Derivation. Rank i's input holds L blocks, block j (B_ij bytes, zero included) for rank j.
// Each block is cut into pieces of P bytes; chunk k is piece k of every off-diagonal block,
// and goes through slot k % depth of the sender's segment area, the piece for local rank j at
// offset j·P (a slot is L x 256 KiB, so P is at most 256 KiB). Per chunk, rank i:
//   post    copies piece k of each block i->j (j != i) into its slot at j·P
//   collect copies piece k of each block j->i out of rank j's slot (at i·P) into its output
// The diagonal block i->i is moved straight from input to output, once, before the loop.
// Per rank: sum_j B_ij read once and written into shared memory, sum_j B_ji copied out of it,
// the output written once; no byte crosses a socket. The pairwise exchange (algo/
// alltoall_pairwise.cc) over shm pairs copies the same bytes (into a pair buffer, out of it)
// but in L-1 sequential steps, each a handshake per pair buffer's worth: L-1 round trips per
// op at least, where this takes 2 milestones per chunk for all peers at once.
//
// Pipelining (Note [Host pipeline] in algo/allreduce_shm.cc, walked by algo/segment_walk.h):
// step t posts chunk t and collects chunk t-1. post(k) waits until every other rank
// released chunk k - depth (rule 2); collect(k) until every other rank posted k (rule 3).
// Every rank runs the same number of chunks, ceil(largest / P), where `largest` is the
// largest off-diagonal block of the whole splits matrix (the negotiated response carries all
// of it, so every rank computes the same value); a rank whose blocks ran out posts empty
// pieces but still publishes, so all counters end the op equal (rule 1). As in allgather_shm,
// P is the slot's share for large blocks but at least 8 pieces per block (down to 16 KiB,
// 128 KiB where the host's cores are shared: Note [Piece size]).
//
// Prediction (2-core AMD VM, float32, pooled output, written before measuring): np=2, 16 MiB
// per rank (8 MiB to each): 8 MiB copied in, 8 MiB out, 8 MiB diagonal per rank = 24 MiB,
// 32 chunks, 2 milestones each: ≈ 3-6 ms (pairwise over shm pairs: one exchange of 8 MiB
// in 1 MiB-ish pair-buffer rounds). np=4, 16 MiB (4 MiB to each): 12 + 12 + 4 MiB per rank,
// two ranks per core: ≈ 10-15 ms. 4 B: one post, one wait, one collect: one round trip through
// the counters per op, as the shm allgather.
// Measured close to the prediction, np=2 at its upper end (benchmarks/history/RESULTS-parts-
// 1-10.md, "The other collectives and sparse gradients (issue #20, part 2)"; today's figures:
// RESULTS.md, "The other collectives"); small ops show the per-op path's two modes under load,
// not this file.
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

class HostAlltoall {
 public:
  HostAlltoall(CollectiveSync& sync, const transport::Comm& comm, const uint8_t* in,
               const std::vector<size_t>& send_bytes, uint8_t* out,
               const std::vector<size_t>& recv_bytes, size_t largest);
  common::Status run();
  // Note [Single-copy ops] in algo/single_copy.cc: each rank reads its block straight out of
  // every peer's input, finding it through the peer's send_at_ table (the op's layout).
  common::Status singleCopy();
  // Note [Shared outputs]: each rank writes its blocks into the receivers' outputs.
  common::Status writeIntoOutputs(bool* use_slots);

 private:
  void post(uint64_t k);
  void collect(uint64_t k);

  CollectiveSync& sync_;
  const uint8_t* const in_;
  uint8_t* const out_;
  const int me_;
  const int n_;
  // By local index j: bytes sent to / received from that rank, and where they lie.
  std::vector<size_t> send_, send_at_, recv_, recv_at_;
  // The single-copy op's layout: (offset, bytes) of the block for local index j at 2j, 2j+1.
  std::vector<uint64_t> layout_;
  SegmentWalk walk_;
  const size_t piece_;
};

HostAlltoall::HostAlltoall(CollectiveSync& sync, const transport::Comm& comm, const uint8_t* in,
                           const std::vector<size_t>& send_bytes, uint8_t* out,
                           const std::vector<size_t>& recv_bytes, size_t largest)
    : sync_(sync), in_(in), out_(out), me_(sync.index()), n_(sync.size()),
      send_(static_cast<size_t>(n_), 0), send_at_(send_.size(), 0), recv_(send_.size(), 0),
      recv_at_(send_.size(), 0),
      walk_(sync, largest, 1,
            static_cast<size_t>(sync.segment().chunkBytes()) / static_cast<size_t>(n_)),
      piece_(walk_.piece()) {
  // Local index j is the host's j-th rank in global order; the buffers are in set-rank order.
  const BlockOffsets send_offsets = prefixBlocks(send_bytes);
  const BlockOffsets recv_offsets = prefixBlocks(recv_bytes);
  for (int r = 0; r < comm.size(); ++r) {
    const size_t j = static_cast<size_t>(sync.localIndexOf(comm.globalRank(r)));
    send_[j] = send_bytes[static_cast<size_t>(r)];
    send_at_[j] = send_offsets[static_cast<size_t>(r)];
    recv_[j] = recv_bytes[static_cast<size_t>(r)];
    recv_at_[j] = recv_offsets[static_cast<size_t>(r)];
  }
}

common::Status HostAlltoall::run() {
  const size_t own = send_[static_cast<size_t>(me_)];
  uint8_t* const own_to = out_ + recv_at_[static_cast<size_t>(me_)];
  const uint8_t* const own_from = in_ + send_at_[static_cast<size_t>(me_)];
  if (own > 0 && own_to != own_from) std::memmove(own_to, own_from, own);
  // SegmentWalk's two stages: post chunk t, collect chunk t-1.
  return walk_.run([this](uint64_t k) { post(k); }, [this](uint64_t k) { collect(k); });
}

common::Status HostAlltoall::singleCopy() {
  size_t total = 0;
  for (size_t b : send_) total += b;
  layout_.assign(2 * static_cast<size_t>(n_), 0);
  for (size_t j = 0; j < send_.size(); ++j) {
    layout_[2 * j] = send_at_[j];
    layout_[2 * j + 1] = send_[j];
  }
  SingleCopyOp op;
  op.in = in_;
  op.bytes = total;
  op.layout = reinterpret_cast<uint64_t>(layout_.data());
  op.local = [&] {
    const size_t own = send_[static_cast<size_t>(me_)];
    uint8_t* const own_to = out_ + recv_at_[static_cast<size_t>(me_)];
    const uint8_t* const own_from = in_ + send_at_[static_cast<size_t>(me_)];
    if (own > 0 && own_to != own_from) std::memmove(own_to, own_from, own);
  };
  op.read = [&](int j, const PeerInput& peer) {
    const size_t want = recv_[static_cast<size_t>(j)];
    if (want == 0) return common::Status::ok();
    uint64_t block[2] = {0, 0};  // (offset, bytes) of the peer's block for this rank
    HVD_RETURN_IF_ERROR(transport::shm::readPeer(
        peer.pid, peer.layout + static_cast<uint64_t>(me_) * sizeof(block), block,
        sizeof(block)));
    HVD_RETURN_IF_ERROR(checkPeerBlock("alltoall", j, peer.bytes, block[0], block[1], want));
    return transport::shm::readPeer(peer.pid, peer.address + block[0],
                                    out_ + recv_at_[static_cast<size_t>(j)], want);
  };
  return runSingleCopy(sync_, op);
}

common::Status HostAlltoall::writeIntoOutputs(bool* use_slots) {
  SharedOutputOp op;
  op.name = "alltoall";
  op.out = out_;
  op.landing.assign(recv_at_.begin(), recv_at_.end());
  op.expected.assign(recv_.begin(), recv_.end());
  for (size_t b : recv_) op.out_bytes += b;
  op.block_for = [&](int j) {
    const auto k = static_cast<size_t>(j);
    return std::make_pair(in_ + send_at_[k], send_[k]);
  };
  return runSharedOutputs(sync_, op, use_slots);
}

void HostAlltoall::post(uint64_t k) {
  uint8_t* const slot = walk_.slot(me_, k);
  for (int j = 0; j < n_; ++j) {
    const size_t len = walk_.pieceLength(send_[static_cast<size_t>(j)], k);
    if (j == me_ || len == 0) continue;
    std::memcpy(slot + static_cast<size_t>(j) * piece_,
                in_ + send_at_[static_cast<size_t>(j)] + k * piece_, len);
  }
}

void HostAlltoall::collect(uint64_t k) {
  const size_t mine = static_cast<size_t>(me_) * piece_;
  for (int j = 0; j < n_; ++j) {
    const size_t len = walk_.pieceLength(recv_[static_cast<size_t>(j)], k);
    if (j == me_ || len == 0) continue;
    std::memcpy(out_ + recv_at_[static_cast<size_t>(j)] + k * piece_, walk_.slot(j, k) + mine,
                len);
  }
}

}  // namespace

common::Status alltoallShm(transport::Comm& comm, const void* in,
                           const std::vector<size_t>& send_bytes, void* out,
                           const std::vector<size_t>& recv_bytes, size_t largest,
                           bool out_shared) {
  transport::shm::CollectiveSegment* segment = CollectiveSync::segmentFor(comm);
  if (segment == nullptr || static_cast<int>(comm.localMembers().size()) != comm.size()) {
    return common::internalError("shm alltoall: no host collective segment serves this "
                                 "process set of " + std::to_string(comm.size()) + " ranks");
  }
  CollectiveSync sync(comm, segment);
  HostAlltoall exchange(sync, comm, static_cast<const uint8_t*>(in), send_bytes,
                        static_cast<uint8_t*>(out), recv_bytes, largest);
  if (comm.size() > 1 &&
      singleCopyServes(sync, largest, transport::shm::SingleCopyScope::kEveryOp)) {
    return exchange.singleCopy();
  }
  if (!out_shared) return exchange.run();
  bool use_slots = false;
  HVD_RETURN_IF_ERROR(exchange.writeIntoOutputs(&use_slots));
  if (!use_slots) return common::Status::ok();
  HostAlltoall slots(sync, comm, static_cast<const uint8_t*>(in), send_bytes,
                     static_cast<uint8_t*>(out), recv_bytes, largest);  // from the next chunk
  return slots.run();
}

}  // namespace hvd::algo
