// The count behind metrics()["host_chunks"]: chunks of completed host ops that went through
// the host collective segment (algo/segment_walk.h adds each op's), each a round of waits on
// the host's ranks (Note [Host pipeline] in algo/allreduce_shm.cc). Any thread reads it.
#pragma once

#include <atomic>
#include <cstdint>

namespace hvd::algo {

inline std::atomic<uint64_t> g_host_chunks{0};
inline uint64_t hostChunks() { return g_host_chunks.load(std::memory_order_relaxed); }

}  // namespace hvd::algo
