// What a process of this kernel is doing, as /proc tells it: the failure path's way to tell a
// rank that is stopped from one that is merely slow (Note [Failure fan-out] in
// runtime/loop_pass.cc). Any thread.
#pragma once

#include <cstdint>

namespace hvd::common {

// The state letter of process `pid` in /proc/<pid>/stat ('R', 'S', 'T' stopped by a signal,
// 't' stopped by its tracer, ...), or '\0' when it cannot be read (gone). The caller must know
// that `pid` names the process it means here: a process of another pid namespace does not.
char processState(int64_t pid);

}  // namespace hvd::common
