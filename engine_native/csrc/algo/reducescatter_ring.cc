// Ring reduce-scatter.
//
// Derivation. The buffer (S bytes, n ranks) is cut into n blocks, block b being the part that
// rank b finally owns (sizes may differ; some may be empty). In step t = 0..n-2 rank r sends
// block (r-t-1) mod n to next = r+1 and receives block (r-t-2) mod n from prev = r-1, reducing
// it into its own copy. Step 0 sends rank r's raw block r-1; what rank r receives in step t is
// prev's block after t+1 contributions (prev's step t-1 result plus prev's own values), so
// after its reduction it holds t+2 contributions. In the last step (t = n-2) rank r receives
// block (r-n) mod n = r with n-1 contributions and adds its own: block r is complete on rank r.
// Every rank sends and receives n-1 blocks: (n-1)/n · S bytes each way (for even blocks), the
// bandwidth lower bound for reduce-scatter.
//
// Pipelining. Each step moves its block in segments of segment_bytes; the receive side uses a
// two-segment buffer. Segment k is received into slot k%2, then handed to the ReduceWorker,
// which reduces it into the block while this thread's next exchange receives segment k+1 into
// the other slot (and sends the next outgoing segment). The one hazard is sending data the
// worker is still writing: step t+1 sends the block step t reduced; if its segment 0 is the
// one in flight on the worker, we wait first. Segments under kOverlapMinSegmentBytes (and
// blocks that fit one segment, where nothing can overlap) are reduced inline from one slot: a
// thread hand-off would cost more than it hides.
#include <algorithm>
#include <cstring>
#include <memory>
#include <new>

#include "algo/algorithms.h"
#include "algo/reduce_worker.h"
#include "algo/ring_util.h"

namespace hvd::algo {
namespace {

// Overlap only pays when a segment's reduction takes much longer than a thread hand-off.
constexpr size_t kOverlapMinSegmentBytes = 64 << 10;
// reducescatterRing() has no options struct; it pipelines in segments of this size.
constexpr size_t kReducescatterSegmentBytes = 1 << 20;

// Segment k of a block: [first, first + count) in elements, count 0 past the block's end.
struct Segment {
  size_t first = 0;
  size_t count = 0;
};

Segment segmentOf(const BlockOffsets& elements, int block, size_t k, size_t seg_elems) {
  const size_t size = blockSize(elements, block);
  const size_t begin = k * seg_elems;
  if (begin >= size) return Segment{};
  return Segment{elements[block] + begin, std::min(seg_elems, size - begin)};
}

// Element range being reduced on the worker (empty when none).
struct InFlight {
  size_t first = 0;
  size_t count = 0;
  bool overlaps(const Segment& s) const {
    return count > 0 && s.count > 0 && s.first < first + count && first < s.first + s.count;
  }
};

}  // namespace

common::Status ringReduceScatterInPlace(transport::Comm& comm, void* data,
                                        const BlockOffsets& elements, common::DataType dtype,
                                        common::ReduceOp op, size_t segment_bytes) {
  const int n = comm.size();
  const int r = comm.rank();
  size_t max_block = 0;
  for (int b = 0; b < n; ++b) max_block = std::max(max_block, blockSize(elements, b));
  if (n == 1 || max_block == 0) return common::Status::ok();

  const size_t esize = common::dataTypeSize(dtype);
  // segment_bytes == 0 means "no pipelining": one segment per block.
  const size_t seg_elems =
      segment_bytes == 0 ? max_block : std::max<size_t>(1, segment_bytes / esize);
  const size_t slot_elems = std::min(seg_elems, max_block);
  const bool overlap = max_block > seg_elems && seg_elems * esize >= kOverlapMinSegmentBytes;
  ReduceWorker* const worker = overlap ? &ReduceWorker::forThisThread() : nullptr;
  // Two receive slots when reductions overlap the next exchange, else one.
  const size_t slot_bytes = slot_elems * esize;
  const size_t scratch_bytes = (overlap ? 2 : 1) * slot_bytes;
  uint8_t* const slots = threadScratch(scratch_bytes);
  if (slots == nullptr) {
    return common::internalError("reduce-scatter: cannot allocate a " +
                                 std::to_string(scratch_bytes) + "-byte receive buffer");
  }
  uint8_t* const base = static_cast<uint8_t*>(data);
  InFlight in_flight;
  int slot = 0;

  for (int step = 0; step + 1 < n; ++step) {
    const int send_block = ringBlock(r, step + 1, n);
    const int recv_block = ringBlock(r, step + 2, n);
    const size_t longest =
        std::max(blockSize(elements, send_block), blockSize(elements, recv_block));
    const size_t segments = (longest + seg_elems - 1) / seg_elems;
    for (size_t k = 0; k < segments; ++k) {
      const Segment out = segmentOf(elements, send_block, k, seg_elems);
      const Segment in = segmentOf(elements, recv_block, k, seg_elems);
      uint8_t* const recv_slot = slots + static_cast<size_t>(slot) * slot_bytes;
      transport::Transfer transfers[2];
      size_t posted = 0;
      if (out.count > 0) {
        // The block we are about to send may still be under reduction on the worker.
        if (in_flight.overlaps(out)) {
          worker->wait();
          in_flight = InFlight{};
        }
        transfers[posted++] = {ringNext(comm), true, base + out.first * esize, out.count * esize};
      }
      if (in.count > 0) {
        transfers[posted++] = {ringPrev(comm), false, recv_slot, in.count * esize};
      }
      // The worker reduces the previous segment while this exchange runs.
      const common::Status status = comm.exchange(transfers, posted);
      if (worker != nullptr) worker->wait();
      in_flight = InFlight{};
      if (!status.isOk()) return status;
      if (in.count == 0) continue;
      void* const dst = base + in.first * esize;
      if (worker != nullptr) {
        worker->post(dst, recv_slot, in.count, dtype, op);
        in_flight = InFlight{in.first, in.count};
        slot ^= 1;
      } else {
        common::reduceInto(dst, recv_slot, in.count, dtype, op);
      }
    }
  }
  if (worker != nullptr) worker->wait();
  return common::Status::ok();
}

namespace {

common::Status checkArguments(const transport::Comm& comm, const std::vector<size_t>& counts,
                              common::DataType dtype, common::ReduceOp op) {
  if (counts.size() != static_cast<size_t>(comm.size())) {
    return common::invalidArgument("reducescatter: " + std::to_string(counts.size()) +
                                   " counts given for a process set of " +
                                   std::to_string(comm.size()) + " ranks");
  }
  return common::checkReducible(dtype, op);
}

}  // namespace

common::Status reducescatterRingInPlace(transport::Comm& comm, void* data, void* out,
                                        const std::vector<size_t>& counts,
                                        common::DataType dtype, common::ReduceOp op) {
  HVD_RETURN_IF_ERROR(checkArguments(comm, counts, dtype, op));
  const BlockOffsets elements = prefixBlocks(counts);
  const size_t esize = common::dataTypeSize(dtype);
  const size_t own_bytes = counts[comm.rank()] * esize;
  if (elements[comm.size()] == 0) return common::Status::ok();
  HVD_RETURN_IF_ERROR(ringReduceScatterInPlace(comm, data, elements, dtype, op,
                                               kReducescatterSegmentBytes));
  const uint8_t* mine = static_cast<const uint8_t*>(data) + elements[comm.rank()] * esize;
  if (out != mine && own_bytes > 0) std::memmove(out, mine, own_bytes);
  return common::Status::ok();
}

common::Status reducescatterRing(transport::Comm& comm, const void* in, void* out,
                                 const std::vector<size_t>& counts, common::DataType dtype,
                                 common::ReduceOp op) {
  HVD_RETURN_IF_ERROR(checkArguments(comm, counts, dtype, op));
  size_t total = 0;
  for (size_t c : counts) total += c;
  const size_t esize = common::dataTypeSize(dtype);
  const size_t total_bytes = total * esize;
  if (total_bytes == 0) return common::Status::ok();
  if (comm.size() == 1) {
    if (out != in) std::memmove(out, in, counts[0] * esize);
    return common::Status::ok();
  }
  // `in` must stay unmodified: reduce in a scratch copy.
  std::unique_ptr<uint8_t[]> scratch(new (std::nothrow) uint8_t[total_bytes]);
  if (!scratch) {
    return common::internalError("reducescatter: cannot allocate a " +
                                 std::to_string(total_bytes) + "-byte scratch buffer");
  }
  std::memcpy(scratch.get(), in, total_bytes);
  return reducescatterRingInPlace(comm, scratch.get(), out, counts, dtype, op);
}

}  // namespace hvd::algo
