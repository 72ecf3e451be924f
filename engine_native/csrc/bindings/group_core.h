// What the C group paths share (bindings/torch_group.cc, bindings/numpy_group.cc): naming a
// checked group's ops and enqueueing them as one group, and waiting for a group with each
// member's failure held until the other members were waited for (waitGroup). Binding code only;
// called with the GIL held (the waits release it), except enqueueNamedGroup (bindings/jax_ffi.cc
// calls it on XLA's threads).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <functional>
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
// The same without Python (any thread, no GIL needed): the core handles in *handles, or the
// core's Status (bindings/jax_ffi.cc's handlers run on XLA's threads).
common::Status enqueueNamedGroup(std::vector<runtime::EnqueueArgs> ops, const std::string& base,
                                 int first, bool waited, std::vector<int64_t>* handles);

// One member's wait for waitGroup: its result (a new reference), or nullptr with an exception
// set and *pending true when the wait was interrupted (Ctrl-C) and the op still runs.
using MemberWait = std::function<PyObject*(Py_ssize_t i, int64_t handle, bool* pending)>;

// Waits for each member of a group whose slot is still None (handles: a list or tuple of core
// handles; slots: a list as long), filling slot i with member i's result or, when it failed, its
// exception (takeError): a failed member never stops the waits for the others. False with the
// exception set when a wait was interrupted: the slots filled so far stay filled and the
// interrupted member's stays None, so a later call with the same slots resumes there (engine_
// native.torch's waits do; the numpy API's synchronize_group drops them). slots may be nullptr
// (a caller that could not make them): every member is still waited for, which frees its name
// and kept objects, and the results are dropped.
bool waitGroup(PyObject* handles, PyObject* slots, const MemberWait& wait);

// The first exception among the slots (borrowed), or nullptr.
PyObject* firstFailure(PyObject* slots);

// The pending exception as a value, its traceback attached; clears it (nullptr when none).
PyObject* takeError();

}  // namespace hvd::bindings
