// What the C group paths share (bindings/torch_group.cc, bindings/numpy_group.cc): naming a
// checked group's ops and enqueueing them as one group, and holding a member's failure until the
// other members were waited for. Binding code only; called with the GIL held.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string>
#include <vector>

#include "runtime/runtime.h"

namespace hvd::bindings {

// Names ops[i] "<base>_<first + i>of<n>" (each API's checked path numbers its members its own
// way: the numpy API from 0, engine_native.torch from 1; a group's names must match on every
// rank, whichever path each rank took), or every op plain <base> when first < 0, and enqueues
// them as one group; `waited`: the caller waits for the group next and its waits drive it
// (Note [Caller drives]). The core handles as a Python list, or nullptr with an exception (the
// core's ValueError for a duplicate name, ...).
PyObject* submitNamedGroup(std::vector<runtime::EnqueueArgs> ops, const std::string& base,
                           int first, bool waited);

// The pending exception as a value, its traceback attached; clears it (nullptr when none).
PyObject* takeError();

}  // namespace hvd::bindings
