// Ring allreduce = ring reduce-scatter, then ring allgather, in place.
//
// Derivation. The S-byte buffer is split into n blocks of count/n elements, the first
// count % n blocks one element longer (blocks are empty when count < n).
//  Phase 1, reduce-scatter (n-1 steps, algo/reducescatter_ring.cc): in step t rank r sends
//    block (r-t-1) mod n to r+1 and receives block (r-t-2) mod n from r-1, reducing it into
//    place; afterwards rank r holds the complete reduction of block r.
//  Phase 2, allgather (n-1 steps, algo/allgather_ring.cc): in step t rank r sends block
//    (r-t) mod n (its own block first) and receives block (r-t-1) mod n, overwriting it.
// Bytes moved per rank: each phase sends and receives (n-1) blocks of S/n, so
// 2(n-1)/n · S in each direction, the bandwidth lower bound for allreduce; 2(n-1) latency terms.
//
// Pipelining. Phase 1 moves each block in segments of opts.segment_bytes through a two-segment
// receive buffer: while segment k is reduced (on the ReduceWorker for large segments), the next
// exchange receives segment k+1 into the other slot. Phase 2 has no arithmetic; each step is
// one exchange whose send and receive progress concurrently.
#include "algo/algorithms.h"
#include "algo/ring_util.h"

namespace hvd::algo {

common::Status allreduceRing(transport::Comm& comm, const AllreduceOptions& opts) {
  HVD_RETURN_IF_ERROR(common::checkReducible(opts.dtype, opts.op));
  const int n = comm.size();
  if (opts.count == 0 || n == 1) return common::Status::ok();
  if (opts.data == nullptr) return common::invalidArgument("allreduce: null data buffer");

  const BlockOffsets elements = evenBlocks(opts.count, n);
  HVD_RETURN_IF_ERROR(ringReduceScatterInPlace(comm, opts.data, elements, opts.dtype, opts.op,
                                               opts.segment_bytes));
  const size_t esize = common::dataTypeSize(opts.dtype);
  BlockOffsets bytes(elements.size());
  for (size_t i = 0; i < elements.size(); ++i) bytes[i] = elements[i] * esize;
  return ringAllgatherInPlace(comm, opts.data, bytes);
}

}  // namespace hvd::algo
