// Collective algorithms: type-erased free functions over a Comm (set ranks) and options.
// Each lives in its own file with a prose derivation at the top (phases, bytes moved,
// pipelining). All are called by the background thread; buffers are host memory owned by the
// caller and stay valid for the call. Every rank of the Comm calls the same function with
// matching arguments (the response list guarantees it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "transport/comm.h"

namespace hvd::algo {

struct AllreduceOptions {
  void* data = nullptr;        // in-place: input on entry, reduced result on return
  size_t count = 0;            // elements
  common::DataType dtype = common::DataType::kFloat32;
  common::ReduceOp op = common::ReduceOp::kSum;  // Average reduces as Sum; caller scales
  size_t segment_bytes = 1 << 20;  // pipelining unit
};
// Ring reduce-scatter + allgather (algo/allreduce_ring.cc).
common::Status allreduceRing(transport::Comm& comm, const AllreduceOptions& opts);

// out = concatenation over set ranks r of each rank's bytes[r]; `in` holds this rank's part.
// (algo/allgather_ring.cc)
common::Status allgatherRing(transport::Comm& comm, const void* in, void* out,
                             const std::vector<size_t>& bytes_per_rank);

// Root's data replaces everyone's (in-place). (algo/broadcast_tree.cc)
common::Status broadcastTree(transport::Comm& comm, void* data, size_t bytes, int root);

// send_bytes[r] from `in` (consecutive) go to rank r; recv_bytes[r] from rank r land in `out`
// (consecutive, in rank order). (algo/alltoall_pairwise.cc)
common::Status alltoallPairwise(transport::Comm& comm, const void* in,
                                const std::vector<size_t>& send_bytes, void* out,
                                const std::vector<size_t>& recv_bytes);

// `in` has sum(counts) elements; rank r receives the reduction of elements
// [offset(r), offset(r)+counts[r]) into `out` (counts[r] elements). (algo/reducescatter_ring.cc)
common::Status reducescatterRing(transport::Comm& comm, const void* in, void* out,
                                 const std::vector<size_t>& counts, common::DataType dtype,
                                 common::ReduceOp op);

// Returns when every rank of the Comm has entered. (algo/barrier.cc)
common::Status barrier(transport::Comm& comm);

}  // namespace hvd::algo
