// Where each rank's bytes go in the collectives whose output the core allocates (allgather,
// alltoall, reducescatter), and the scale factors of the reductions: pure functions of the
// negotiated Response, shared by the CPU and the device executors so both lay out results the
// same way on every rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "coord/message.h"

namespace hvd::runtime {

struct GatherLayout {
  std::vector<size_t> bytes;   // per set rank: its block (first dims may differ)
  size_t total = 0;
  std::vector<int64_t> shape;  // of the concatenated output
};
GatherLayout allgatherLayout(const coord::Response& r);

// A fused allgather (Note [Allgather fusion] in coord/fusion.cc) gathered as one allgatherv:
// set rank k's block holds its rows of every tensor, in response order, so block k is
// sum over tensors i of first_dims[i][k] x row bytes of i. Tensor i's part from rank k starts
// at block_offset[k] + part_offset[i * set_size + k] of the gathered buffer.
struct FusedGatherLayout {
  std::vector<size_t> block;           // per set rank: its block's bytes
  std::vector<size_t> block_offset;    // per set rank: where its block starts
  size_t total = 0;                    // the gathered buffer
  std::vector<size_t> part_offset;     // tensor-major: part (i, k)'s offset within block k
  std::vector<size_t> part_bytes;      // tensor-major: part (i, k)'s bytes
  std::vector<size_t> output_bytes;    // per tensor: its output (all ranks' parts)
  std::vector<std::vector<int64_t>> shapes;  // per tensor: its output's shape
};
// The layout, or an internal error when the response's fields do not describe set_size ranks.
common::Status fusedAllgatherLayout(const coord::Response& r, int set_size,
                                    FusedGatherLayout* out);

struct AlltoallLayout {
  std::vector<size_t> send;              // bytes this rank sends to each set rank
  std::vector<size_t> recv;              // bytes it receives from each
  size_t total = 0;                      // sum of recv
  std::vector<int64_t> shape;            // of the output
  std::vector<int64_t> received_splits;  // rows received from each set rank
  size_t largest = 0;  // bytes of the largest off-diagonal block of the whole splits matrix
};
AlltoallLayout alltoallLayout(const coord::Response& r, int set_rank, int set_size);

struct ReducescatterLayout {
  std::vector<size_t> counts;  // elements of each set rank's block (Horovod's split)
  std::vector<int64_t> shape;  // of this rank's output
  size_t input_bytes = 0;      // of the whole input
};
ReducescatterLayout reducescatterLayout(const coord::Response& r, int set_rank, int set_size);

// Element count of a response's tensors together (fused allreduce: the fusion buffer).
int64_t totalCount(const coord::Response& r);
// Bytes a broadcast sends (its one tensor; never fused).
size_t broadcastBytes(const coord::Response& r);
// The factor applied after the sum: postscale, divided by the set size for Average.
double postFactor(const coord::Response& r, int set_size);

}  // namespace hvd::runtime
