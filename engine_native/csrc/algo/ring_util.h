// Shared pieces of the ring algorithms: how a buffer is cut into per-rank blocks, the two ring
// phases used by allreduce/reducescatter/allgather, and a per-thread scratch buffer.
// Internal to algo/; called only from the algorithm entry points on the background thread.
//
// Note [Ring wire protocol]: in each ring step a rank sends one block to next = (r+1) % n and
// receives one from prev = (r-1+n) % n, in one Comm::exchange. Both ends derive every transfer's
// size from the same layout, so sends and receives pair up one to one, in the same order, on
// every per-peer byte stream. Zero-byte transfers are never posted (by either end).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "transport/comm.h"

namespace hvd::algo {

// offsets[i] .. offsets[i+1] is block i; offsets has n+1 entries (units chosen by the caller).
using BlockOffsets = std::vector<size_t>;

// Split `count` elements into n blocks as evenly as possible: the first count % n blocks get
// one extra element. Blocks may be empty when count < n.
inline BlockOffsets evenBlocks(size_t count, int n) {
  BlockOffsets offsets(static_cast<size_t>(n) + 1, 0);
  const size_t base = count / static_cast<size_t>(n);
  const size_t extra = count % static_cast<size_t>(n);
  for (size_t i = 0; i < static_cast<size_t>(n); ++i) {
    offsets[i + 1] = offsets[i] + base + (i < extra ? 1 : 0);
  }
  return offsets;
}

// Prefix sums of per-rank sizes (n+1 entries).
inline BlockOffsets prefixBlocks(const std::vector<size_t>& sizes) {
  BlockOffsets offsets(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) offsets[i + 1] = offsets[i] + sizes[i];
  return offsets;
}

inline size_t blockSize(const BlockOffsets& offsets, int block) {
  return offsets[block + 1] - offsets[block];
}

inline int ringNext(const transport::Comm& comm) { return (comm.rank() + 1) % comm.size(); }
inline int ringPrev(const transport::Comm& comm) {
  return (comm.rank() + comm.size() - 1) % comm.size();
}
// Block index (r - k) mod n for any k in [0, 2n).
inline int ringBlock(int rank, int k, int n) { return ((rank - k) % n + 2 * n) % n; }

// Phase 1 of the ring: in-place reduce-scatter of `data` (element offsets). On return block r
// of rank r holds the reduction over all ranks; other blocks hold partial sums. Blocks move in
// segments of segment_bytes (rounded down to whole elements, at least one; 0 = whole blocks).
// The caller has checked the op with common::checkReducible.
// (algo/reducescatter_ring.cc)
common::Status ringReduceScatterInPlace(transport::Comm& comm, void* data,
                                        const BlockOffsets& elements, common::DataType dtype,
                                        common::ReduceOp op, size_t segment_bytes);

// Phase 2 of the ring: in-place allgather of `data` (byte offsets) given that block r of rank r
// is valid. On return every block is valid on every rank. (algo/allgather_ring.cc)
common::Status ringAllgatherInPlace(transport::Comm& comm, void* data, const BlockOffsets& bytes);

// A receive buffer owned by the calling thread, grown on demand and kept for the next call
// (the ring's two-segment buffer would otherwise be a fresh mmap and page faults per call).
// Valid until the next call on the same thread; nullptr if memory is exhausted.
inline uint8_t* threadScratch(size_t bytes) {
  thread_local std::unique_ptr<uint8_t[]> buffer;
  thread_local size_t capacity = 0;
  if (bytes > capacity) {
    buffer.reset(new (std::nothrow) uint8_t[bytes]);
    capacity = buffer ? bytes : 0;
  }
  return buffer.get();
}

}  // namespace hvd::algo
