// How a Comm's members sit on hosts, and the intra-host halves of the hierarchical
// algorithms (algo/allreduce_hierarchical.cc, algo/allreduce_adasum.cc): a
// reduce-scatter into one block per local rank and the allgather back. Internal to algo/;
// background thread.
#pragma once

#include <cstddef>
#include <vector>

#include "common/dtype.h"
#include "common/status.h"
#include "transport/comm.h"

namespace hvd::algo {

// The Comm's members grouped by host: hosts in order of their first set rank, members of a
// host in global-rank order (the order of the host collective segment). Global ranks.
struct HostLayout {
  std::vector<std::vector<int>> hosts;
  int my_host = -1;
  int my_local = -1;
  bool even = true;  // every host has the same number of members
};
HostLayout layoutOf(const transport::Comm& comm);

// A Comm over some of `comm`'s members (global ranks, in set-rank order), same mesh and terms.
transport::Comm subComm(const transport::Comm& comm, std::vector<int> members);

// `local` holds every member of this host in the Comm. The buffer is cut into L blocks as
// evenBlocks(count, L) does; on return block l of local rank l is reduced over the host
// (through the host collective segment when it serves `local`, else the shm/tcp ring).
common::Status hostBlocksReduceScatter(transport::Comm& local, void* data, size_t count,
                                       common::DataType dtype, common::ReduceOp op,
                                       size_t segment_bytes);
// Given block l valid on local rank l, every block is valid on every local rank on return.
common::Status hostBlocksAllgather(transport::Comm& local, void* data, size_t count,
                                   common::DataType dtype);

}  // namespace hvd::algo
