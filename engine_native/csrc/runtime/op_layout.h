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
// The factor applied after the sum: postscale, divided by the set size for Average.
double postFactor(const coord::Response& r, int set_size);

}  // namespace hvd::runtime
