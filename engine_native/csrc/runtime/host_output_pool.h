// Host output pool: the host memory of the outputs the core allocates for CPU tensors
// (allgather, alltoall, reducescatter), reused across ops instead of a fresh allocation per
// op. A fresh block of many MiB is a fresh mapping: the first write of each of its pages
// faults and the kernel zeroes it (page faults were most of a 16 MiB np=2 allgather's profile:
// benchmarks/history/RESULTS-parts-1-10.md, "Allgather and broadcast through the shared segment
// (issue #20, part 1)"). Process-wide (an output may outlive the init() that made it),
// never destroyed, locked: blocks are taken by the background loop and given back by whatever
// thread drops the last reference (a NumPy array, a torch tensor).
#pragma once

#include <cstddef>
#include <memory>

#include "runtime/handle_table.h"

namespace hvd::runtime {

// An output of `bytes`: below 1 MiB a plain allocation (malloc reuses those without faults);
// from 1 MiB, a power-of-two block from the pool (Note [Host output reuse]). shared: any size
// from a pool of shared blocks (transport/shm/shared_blocks.h) that peers of this host can
// write into; a plain one when the kernel refuses a shared block (the op then says so).
std::shared_ptr<OutputBuffer> hostOutput(size_t bytes, bool shared = false);

}  // namespace hvd::runtime
