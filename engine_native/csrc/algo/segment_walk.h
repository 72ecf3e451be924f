// SegmentWalk: one op's pipelined walk over the host collective segment's slots, shared by the
// five shm algorithms (algo/{allreduce,allgather,broadcast,alltoall,reducescatter}_shm.cc). It
// owns the op's chunk numbering, the waits and the milestones of Note [Host pipeline]; the
// algorithm hands it one callable per stage, which only moves and reduces bytes. Header-only:
// the stages inline into the loop of every host collective. Background thread only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "algo/host_chunks.h"
#include "common/check.h"
#include "common/status.h"
#include "transport/shm/collective_sync.h"

namespace hvd::algo {

// Note [Piece size]. A chunk carries one piece of every rank's part (block, message) through a
// slot. A piece fills its share of the slot for large parts, but a part gets at least
// kMinPieces pieces (down to kMinPieceBytes) so a part of a few hundred KiB still pipelines:
// a 200 x 4 KiB allreduce went from 2 chunks to 8 and from ~615 to ~480 us, a 1 MiB allgather
// part overlaps copy-in with copy-out. A part of a few KiB is one chunk: one post, one wait,
// one collect. Pieces are whole 64-byte lines, so every piece starts on a cache line.
// Where the host's ranks share cores (CollectiveSync::hostOutnumbered, the same answer on
// every rank of the host, as the chunk count must be), a piece of an op that only copies
// (allgather, broadcast, alltoall) is at least 128 KiB: each chunk is a round of waits on
// peers that may sit in the run queue (tens of microseconds a wake-up on a VM), about what
// copying 128 KiB takes, so a smaller piece costs more than it overlaps. Reductions keep fine
// pieces: with the floor, 1 MiB reduce-scatters at np=4 on 2 cores took 1.6-2.6x as long.
// The embedding step's 165 KiB sparse allgather went from 8 chunks to 2 (benchmarks/
// RESULTS.md, "The embedding step at np=4 on 2 cores").

class SegmentWalk {
 public:
  // Parts of at most `largest` units of `unit` bytes each (an element, or 1 for bytes), whose
  // pieces may take `share` bytes of a slot. Every rank writes its own slot (writer < 0), or
  // only local rank `writer` does (broadcast). Chunk 0 of the op is the first chunk after the
  // last op's (rule 1 of Note [Host pipeline]).
  // `folds`: a stage reduces (allreduce, reducescatter), which fine pieces overlap with the
  // copies even where cores are shared, so the floor of Note [Piece size] does not apply.
  SegmentWalk(transport::shm::CollectiveSync& sync, size_t largest, size_t unit, size_t share,
              int writer = -1, bool folds = false)
      : sync_(sync),
        piece_(pieceUnits(largest, unit, share, sync.hostOutnumbered() && !folds)),
        chunks_((largest + piece_ - 1) / piece_), base_(sync.released()),
        depth_(sync.segment().depth()), writer_(writer) {}

  // Units per piece (Note [Piece size]): piece k of a part is units [k * piece, (k+1) * piece).
  size_t piece() const { return piece_; }
  // Units of piece k of a part of `part` units: 0 past its end (a shorter part's pieces are
  // empty, but its rank still walks every chunk).
  size_t pieceLength(size_t part, uint64_t k) const {
    const size_t begin = k * piece_;
    return begin >= part ? 0 : std::min(piece_, part - begin);
  }
  // Local rank j's slot for chunk k of this op.
  uint8_t* slot(int j, uint64_t k) const { return sync_.segment().slot(j, base_ + k); }

  // The pipeline of Note [Host pipeline]: step t runs stage s on chunk t - s, so each stage
  // needs only what the other ranks did one step earlier. stage(k) moves chunk k's bytes; the
  // walk waits before it and publishes after it:
  //   stage 0   waits until every other rank released chunk k - depth (rule 2: its slot is
  //             free), publishes kPosted
  //   stage s   waits until every other rank passed milestone s - 1 for chunk k (rule 3),
  //             publishes milestone s
  //   the last stage publishes every milestone from its own on, so all counters end the op
  //   equal (rule 1).
  // With one writer its stage 0 publishes every milestone (nothing later of its own is waited
  // for) and its later stages are local work on the same chunk in the same step, while the
  // piece is still in cache; every other rank runs one stage, which waits until the writer
  // posted chunk k and publishes every milestone.
  template <typename... Stages>
  common::Status run(Stages&&... stages) {
    constexpr int kStages = static_cast<int>(sizeof...(Stages));
    static_assert(kStages >= 1 && kStages <= transport::shm::kStageCount, "1 to 3 stages");
    HVD_CHECK(depth_ >= kStages);  // no cycle: in step t a rank waits only on steps <= t - 1
    for (uint64_t t = 0; t < chunks_ + kStages - 1; ++t) {
      HVD_RETURN_IF_ERROR((step<0, kStages>(t, stages...)));
    }
    g_host_chunks.fetch_add(chunks_, std::memory_order_relaxed);
    return common::Status::ok();
  }

 private:
  using Stage = transport::shm::Stage;

  template <int kStage, int kStages, typename First, typename... Rest>
  common::Status step(uint64_t t, First& first, Rest&... rest) {
    const uint64_t lag = writer_ >= 0 ? 0 : kStage;
    if (t >= lag && t - lag < chunks_) {
      const uint64_t k = t - lag;
      HVD_RETURN_IF_ERROR(waitBefore<kStage>(k));
      first(k);
      publishAfter<kStage, kStages>(k);
    }
    if constexpr (sizeof...(Rest) > 0) return step<kStage + 1, kStages>(t, rest...);
    return common::Status::ok();
  }

  template <int kStage>
  common::Status waitBefore(uint64_t k) {
    const uint64_t g = base_ + k;
    if (writer_ >= 0 && sync_.index() != writer_) {
      return sync_.waitFor(writer_, Stage::kPosted, g + 1);
    }
    if constexpr (kStage == 0) {
      if (g < depth_) return common::Status::ok();
      return sync_.waitAll(Stage::kReleased, g + 1 - depth_);  // rule 2
    } else {
      if (writer_ >= 0) return common::Status::ok();
      return sync_.waitAll(static_cast<Stage>(kStage - 1), g + 1);  // rule 3
    }
  }

  template <int kStage, int kStages>
  void publishAfter(uint64_t k) {
    const uint64_t value = base_ + k + 1;
    if constexpr (kStage == 0) {
      if (writer_ >= 0 || kStages == 1) {
        sync_.publish({Stage::kPosted, Stage::kReduced, Stage::kReleased}, value);
      } else {
        sync_.publish({Stage::kPosted}, value);
      }
    } else if constexpr (kStage == 1) {
      if (writer_ >= 0) return;
      if (kStages == 2) {
        sync_.publish({Stage::kReduced, Stage::kReleased}, value);
      } else {
        sync_.publish({Stage::kReduced}, value);
      }
    } else {
      if (writer_ < 0) sync_.publish({Stage::kReleased}, value);
    }
  }

  static constexpr size_t kMinPieces = 8;                // Note [Piece size]
  static constexpr size_t kMinPieceBytes = 16 << 10;
  static constexpr size_t kMinPieceBytesCoresShared = 128 << 10;

  static size_t pieceUnits(size_t largest, size_t unit, size_t share, bool cores_shared) {
    const size_t spread = (largest + kMinPieces - 1) / kMinPieces * unit;
    const size_t least = cores_shared ? kMinPieceBytesCoresShared : kMinPieceBytes;
    const size_t wanted = (std::max(spread, least) + 63) / 64 * 64;
    return std::max<size_t>(1, std::min(share / 64 * 64, wanted) / unit);
  }

  transport::shm::CollectiveSync& sync_;
  const size_t piece_;
  const uint64_t chunks_;
  const uint64_t base_;
  const uint64_t depth_;
  const int writer_;
};

}  // namespace hvd::algo
