// Shared-memory allreduce among the L ranks of one host, through the host collective segment
// (transport/shm/collective_segment.h): a reduce-scatter and an allgather in one pipeline.
//
// Derivation. The buffer (S bytes) is cut into L blocks; local rank j owns block j. Blocks are
// cut into pieces of P = 256 KiB; chunk k is piece k of every block, and goes through slot
// k % depth of every rank's segment area, piece j at offset j·P. Per chunk, rank i:
//   post    copies its pieces j != i into its slot                      (L-1)/L of the chunk
//   reduce  reduces piece i in its own buffer with piece i of every other rank's slot (reading
//           L-1 pieces straight from shared memory), then copies the result into its slot
//   collect copies every other rank's reduced piece j from that rank's slot into its buffer
// Its own piece is never copied in: it is reduced where it lies. Per rank: (L-1)/L·S copied
// in, (L-1)·S/L reduced, S/L published, (L-1)/L·S copied out, and no byte crosses a socket.
// The user buffer is read once and written once (DRAM); the slot traffic stays in L2/L3
// because a chunk is consumed one or two steps after it was written.
//
// Pipelining (Note [Host pipeline]). Step t posts chunk t, reduces chunk t-1 and collects
// chunk t-2. Each stage needs only what the other ranks did one step earlier, so ranks in step
// overlap one rank's copy-in with another's reduction and a third's copy-out, and a rank never
// waits for a peer's concurrent step; a late peer costs a bounded spin, then a futex sleep.
// Slots are reused after `depth` (4) chunks. Pieces of 256 KiB halve the synchronisations of
// 128 KiB at no cache cost (measured: fewer sleeps and less CPU per op at np 2 and 4); a
// greedy schedule that posts ahead while peers lag was tried and lost (colder slots).
//
// Small buffers (<= kWholeBytes) take one round instead: every rank posts its whole buffer and
// every rank reduces all L copies in local-rank order (identical results everywhere), so one
// synchronisation replaces two.
//
// A fused batch (opts.tensors) goes through the same pipeline without a fusion buffer: post
// reads the pieces straight from the tensors' inputs, the own piece is reduced into the
// outputs (copied from the inputs first when they differ: 4 KiB at a time, still in L1), and
// collect writes straight into the outputs (SpanBuffer). Per rank that saves packing S bytes
// in and S bytes out: of a 200 x 4 KiB step's 2.8 MB of copies, 1.2 MB are left.
//
// Prediction (2-core machine of perf-anchors): at L=2 and 64 MiB each rank copies S/2 in,
// reduces S/2, publishes S/2 and copies S/2 out; DRAM sees about one S-byte read and one S-byte
// write per rank (~13 ms at 10.5 GB/s of copy traffic), the slot traffic stays in cache:
// ≈ 16 ms, busbw ≈ 4 GB/s (MPI: 1.2-1.8). At L=4 on 2 cores each core carries two ranks of the
// same traffic: ≈ 40 ms, busbw ≈ 2.5 GB/s (MPI: 0.7-1.0).
// It halved the ring's time and CPU per rank at np 2 and 4 (benchmarks/history/
// RESULTS-parts-1-10.md, "Core allreduce: shared-memory segment vs ring (issue #3)"; today's
// figures: RESULTS.md, "Allreduce against MPICH, gloo and Horovod").
//
// Note [Host pipeline]
// Counters: rank i's kPosted/kReduced/kReleased count chunks past that milestone; a chunk's
// number is global (counters never reset), so an op starts where the last one ended. Rules:
//   1. Every op that uses the segment involves every rank of the host (CollectiveSync::
//      segmentFor), and every rank executes the response list in the same order, so all ranks
//      run the same sequence of pipelines with the same chunk counts: at the start of an op
//      all counters of all ranks are equal (= released()).
//   2. post(g) waits until every other rank released chunk g - depth: the slot is free.
//   3. reduce(g) waits until every other rank posted g; collect(g) until all reduced g.
//   4. Each counter is published once per chunk, after the slot bytes it covers are written
//      (a seq_cst store: the release that publishes them).
// No cycle: in step t a rank waits only for the others' steps <= t-1 (depth >= 3), which in
// turn needed from it only steps <= t-2, already done.
// SegmentWalk (algo/segment_walk.h) carries out these rules for every shm algorithm: the
// algorithm gives it the stages, it numbers the chunks, waits and publishes.
// An error (abort, lost peer, timeout) fails the core, which closes the mesh and the segment:
// counters are never reused after a broken op.
#include <algorithm>
#include <cstring>

#include "algo/algorithms.h"
#include "algo/ring_util.h"
#include "algo/segment_walk.h"
#include "transport/shm/collective_sync.h"

namespace hvd::algo {
namespace {

using transport::shm::CollectiveSync;

constexpr size_t kWholeBytes = 8 << 10;

enum class Kind {
  kAllreduce,      // post, reduce + publish, collect
  kReduceScatter,  // post, reduce: block i ends reduced in rank i's buffer
  kAllgather,      // post own piece, collect
  kWhole,          // post everything, everyone reduces everything
};

// Chunk k's piece j: elements [first, first + count) of the buffer, at `offset` in a slot.
struct Piece {
  size_t first = 0;
  size_t count = 0;
  size_t offset = 0;
};

class HostPipeline {
 public:
  HostPipeline(CollectiveSync& sync, Kind kind, SpanBuffer buffer, size_t count,
               common::DataType dtype, common::ReduceOp op);
  common::Status run();

 private:
  Piece piece(uint64_t k, int j) const;
  uint8_t* slotOf(int j, uint64_t k) const { return walk_.slot(j, k); }
  void copyIn(const Piece& p, uint64_t k) const;
  // The stages; the walk waits for what Note [Host pipeline] rules 2 and 3 require before
  // each and publishes its milestone after it.
  void postOthers(uint64_t k);  // the pieces this rank does not reduce
  void postOwn(uint64_t k);     // kAllgather: the piece this rank holds
  void postWhole(uint64_t k);
  void reduce(uint64_t k);      // this rank's piece, from every rank's slot
  void reduceWhole(uint64_t k);
  void collect(uint64_t k);     // every other rank's reduced piece

  const Kind kind_;
  const SpanBuffer buffer_;
  const size_t count_;
  const common::DataType dtype_;
  const common::ReduceOp op_;
  const size_t esize_;
  const int me_;
  const int n_;
  const BlockOffsets blocks_;  // kWhole: unused
  SegmentWalk walk_;           // kWhole: pieces of the buffer; else of block 0, the largest
};

HostPipeline::HostPipeline(CollectiveSync& sync, Kind kind, SpanBuffer buffer, size_t count,
                           common::DataType dtype, common::ReduceOp op)
    : kind_(kind), buffer_(std::move(buffer)), count_(count), dtype_(dtype), op_(op),
      esize_(common::dataTypeSize(dtype)), me_(sync.index()), n_(sync.size()),
      blocks_(kind == Kind::kWhole ? BlockOffsets{} : evenBlocks(count, n_)),
      walk_(sync, kind == Kind::kWhole ? count : blockSize(blocks_, 0), esize_,
            static_cast<size_t>(sync.segment().chunkBytes()) /
                static_cast<size_t>(kind == Kind::kWhole ? 1 : n_),
            /*writer=*/-1, /*folds=*/kind != Kind::kAllgather) {}

Piece HostPipeline::piece(uint64_t k, int j) const {
  const size_t first = k * walk_.piece();
  if (kind_ == Kind::kWhole) return Piece{first, walk_.pieceLength(count_, k), 0};
  return Piece{blocks_[j] + first, walk_.pieceLength(blockSize(blocks_, j), k),
               static_cast<size_t>(j) * walk_.piece() * esize_};
}

// The loop of Note [Host pipeline]: step t posts chunk t, reduces t-1 and collects t-2.
common::Status HostPipeline::run() {
  auto post_others = [this](uint64_t k) { postOthers(k); };
  auto reduce_own = [this](uint64_t k) { reduce(k); };
  auto collect_others = [this](uint64_t k) { collect(k); };
  switch (kind_) {
    case Kind::kAllreduce: return walk_.run(post_others, reduce_own, collect_others);
    case Kind::kReduceScatter: return walk_.run(post_others, reduce_own);
    case Kind::kAllgather: return walk_.run([this](uint64_t k) { postOwn(k); }, collect_others);
    case Kind::kWhole:
      return walk_.run([this](uint64_t k) { postWhole(k); },
                       [this](uint64_t k) { reduceWhole(k); });
  }
  return common::internalError("shm allreduce: unknown pipeline kind");
}

void HostPipeline::copyIn(const Piece& p, uint64_t k) const {
  uint8_t* const to = slotOf(me_, k) + p.offset;
  const size_t esize = esize_;
  buffer_.forRange(p.first, p.count, [to, esize](const uint8_t* in, uint8_t*, size_t n,
                                                 size_t off) {
    std::memcpy(to + off * esize, in, n * esize);
  });
}

void HostPipeline::postOthers(uint64_t k) {
  for (int j = 0; j < n_; ++j) {
    if (j != me_) copyIn(piece(k, j), k);
  }
}

void HostPipeline::postOwn(uint64_t k) { copyIn(piece(k, me_), k); }

void HostPipeline::postWhole(uint64_t k) { copyIn(piece(k, 0), k); }

void HostPipeline::reduce(uint64_t k) {
  const Piece p = piece(k, me_);
  const bool publish = kind_ != Kind::kReduceScatter;
  uint8_t* const own_slot = slotOf(me_, k) + p.offset;
  const size_t esize = esize_;
  buffer_.forRange(p.first, p.count, [&](const uint8_t* in, uint8_t* out, size_t n,
                                         size_t off) {
    if (in != out) std::memcpy(out, in, n * esize);
    for (int j = 0; j < n_; ++j) {
      if (j != me_) common::reduceInto(out, slotOf(j, k) + p.offset + off * esize, n, dtype_, op_);
    }
    if (publish) std::memcpy(own_slot + off * esize, out, n * esize);
  });
}

// Every rank folds the L copies in the same order, so every rank gets the same bits.
void HostPipeline::reduceWhole(uint64_t k) {
  const Piece p = piece(k, 0);
  const size_t esize = esize_;
  buffer_.forRange(p.first, p.count, [&](const uint8_t*, uint8_t* out, size_t n, size_t off) {
    std::memcpy(out, slotOf(0, k) + off * esize, n * esize);
    for (int j = 1; j < n_; ++j) {
      common::reduceInto(out, slotOf(j, k) + off * esize, n, dtype_, op_);
    }
  });
}

void HostPipeline::collect(uint64_t k) {
  const size_t esize = esize_;
  for (int j = 0; j < n_; ++j) {
    if (j == me_) continue;
    const Piece p = piece(k, j);
    const uint8_t* const from = slotOf(j, k) + p.offset;
    buffer_.forRange(p.first, p.count, [from, esize](const uint8_t*, uint8_t* out, size_t n,
                                                     size_t off) {
      std::memcpy(out, from + off * esize, n * esize);
    });
  }
}

common::Status runPipeline(transport::Comm& comm, Kind kind, SpanBuffer buffer, size_t count,
                           common::DataType dtype, common::ReduceOp op) {
  transport::shm::CollectiveSegment* segment = CollectiveSync::segmentFor(comm);
  if (segment == nullptr) {
    return common::internalError("shm allreduce: this host has no collective segment for a "
                                 "process set of " + std::to_string(comm.size()) + " ranks");
  }
  CollectiveSync sync(comm, segment);
  HostPipeline pipeline(sync, kind, std::move(buffer), count, dtype, op);
  return pipeline.run();
}

}  // namespace

bool shmTakesTensors(const AllreduceOptions& opts) {
  return opts.count * common::dataTypeSize(opts.dtype) > kWholeBytes;
}

common::Status allreduceShm(transport::Comm& comm, const AllreduceOptions& opts) {
  HVD_RETURN_IF_ERROR(common::checkReducible(opts.dtype, opts.op));
  if (opts.count == 0 || comm.size() == 1) return common::Status::ok();
  const bool spans = opts.tensors != nullptr;
  if (spans && !shmTakesTensors(opts)) {
    return common::internalError("shm allreduce: a fused batch this small needs a buffer");
  }
  if (!spans && opts.data == nullptr) {
    return common::invalidArgument("allreduce: null data buffer");
  }
  if (static_cast<int>(comm.localMembers().size()) != comm.size()) {
    return common::internalError("shm allreduce: the process set spans several hosts");
  }
  const size_t esize = common::dataTypeSize(opts.dtype);
  const bool whole = opts.count * esize <= kWholeBytes;
  SpanBuffer buffer = spans ? SpanBuffer(*opts.tensors, esize) : SpanBuffer(opts.data, esize);
  return runPipeline(comm, whole ? Kind::kWhole : Kind::kAllreduce, std::move(buffer),
                     opts.count, opts.dtype, opts.op);
}

common::Status hostReduceScatter(transport::Comm& comm, void* data, size_t count,
                                 common::DataType dtype, common::ReduceOp op) {
  HVD_RETURN_IF_ERROR(common::checkReducible(dtype, op));
  if (count == 0) return common::Status::ok();
  return runPipeline(comm, Kind::kReduceScatter, SpanBuffer(data, common::dataTypeSize(dtype)),
                     count, dtype, op);
}

common::Status hostAllgather(transport::Comm& comm, void* data, size_t count,
                             common::DataType dtype) {
  if (count == 0) return common::Status::ok();
  return runPipeline(comm, Kind::kAllgather, SpanBuffer(data, common::dataTypeSize(dtype)), count,
                     dtype, common::ReduceOp::kSum);
}

}  // namespace hvd::algo
