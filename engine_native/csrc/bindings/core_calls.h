// Calls into the runtime that several binding files share (defined in bindings/module.cc).
// Binding code only; called with the GIL held, except awaitResult.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <string_view>

#include "common/status.h"
#include "runtime/handle_table.h"

namespace hvd::bindings {

// Sets the Python exception for a failed Status (ValueError, TypeError or
// HorovodInternalError) and returns nullptr.
PyObject* raiseStatus(const common::Status& status);
// wait(): blocks with the GIL released until `handle` finished, checking for signals every
// 50 ms. Returns the op's result (None, (Buffer, shape), ...), or nullptr with an exception:
// the op's error, or a KeyboardInterrupt (then the op is still pending and the handle valid).
PyObject* waitHandle(int64_t handle);
// wait() without the conversion to Python: true when the op finished (its Status and result
// filled, the handle released), false with a KeyboardInterrupt (or a signal handler's
// exception) set, the op still pending and the handle valid. On a thread an io_callback labelled
// (jitCallbackLabel()) it checks no signal and returns only when the op finished.
bool waitResult(int64_t handle, common::Status* status, runtime::OpResult* result);
// waitResult's wait on a thread without the GIL (bindings/jax_ffi.cc's handler, on XLA's
// threads): drives and waits until the op finished (the handle released), however long: a
// stalled op is reported, and failed only after HVD_STALL_SHUTDOWN_TIME when that is set (an
// error, a lost peer or abort() end it too, and a Ctrl-C, which aborts the core naming
// `jit_op`: Note [Ctrl-C inside jax.jit] in bindings/jit_interrupt.h).
bool awaitResult(int64_t handle, common::Status* status, runtime::OpResult* result,
                 std::string_view jit_op);

}  // namespace hvd::bindings
