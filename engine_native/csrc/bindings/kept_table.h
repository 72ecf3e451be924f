// What stays alive while the core uses a Python object's memory (Note [Handle lifetime] in
// engine_native/torch/runtime.py), for the per-tensor paths written in C (numpy_api.cc,
// torch_api.cc): by core handle, the objects to keep, the output synchronize returns and an
// optional finish callable. Binding code only; every function runs with the GIL held.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>

namespace hvd::bindings {

// Holds new references to `keep`, `output` and `finish` (each may be nullptr) until
// synchronizeKept(handle) returns.
void keepRefs(int64_t handle, PyObject* keep, PyObject* output, PyObject* finish);

// True while `handle` has references kept (enqueued by a C path and not yet synchronized).
bool isKept(int64_t handle);

// Waits for `handle`, then returns its kept output (or finish(core result)); a handle that
// keeps nothing returns the core's own result. An interrupted wait keeps the references (the
// op is still pending); a failed op drops them. nullptr with a Python exception on failure.
PyObject* synchronizeKept(int64_t handle);

// Drops every kept reference: after the core shut down, no op uses any of that memory, and a
// later init() starts handles afresh (so a stale entry could shadow a new handle).
void releaseAllKept();

}  // namespace hvd::bindings
