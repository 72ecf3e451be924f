// What a process of this kernel is doing, as /proc tells it: the failure path's way to tell a
// rank that is stopped from one that is merely slow (Note [Failure fan-out] in
// runtime/loop_pass.cc). Any thread.
#pragma once

#include <cstdint>

namespace hvd::common {

// Whether process `pid` is stopped: SIGSTOP, job control, or a tracer's stop (state T or t in
// /proc/<pid>/stat). False when that cannot be read (gone, or not in this pid namespace).
bool processStopped(int64_t pid);

}  // namespace hvd::common
