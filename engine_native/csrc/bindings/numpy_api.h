// The numpy API's per-tensor path (bindings/numpy_api.cc): allreduce_async, synchronize, keep
// and numpy_setup; broadcast_async, broadcast_async_ and numpy_broadcast_setup
// (bindings/numpy_broadcast.cc); aligned_like, grouped_allreduce_aligned and synchronize_group
// (bindings/numpy_group.cc); jax_setup and jax_host_views (bindings/jax_host.cc). Added to
// engine_native._core. Binding code only.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace hvd::bindings {

// Adds the functions to the module; -1 with a Python exception on failure.
int addNumpyBindings(PyObject* module);
// The broadcast functions alone (addNumpyBindings calls it, after numpy's C API is imported).
int addNumpyBroadcastBindings(PyObject* module);
// The group functions alone (likewise).
int addNumpyGroupBindings(PyObject* module);
// allgather_async, alltoall_async, reducescatter_async and numpy_gathers_setup alone
// (bindings/numpy_gathers.cc; likewise).
int addNumpyGatherBindings(PyObject* module);
// engine_native.jax's host views (likewise).
int addJaxHostBindings(PyObject* module);
// engine_native.jax's XLA FFI handlers, xla_ffi_targets() (bindings/jax_ffi.cc; needs no numpy).
int addJaxFfiBindings(PyObject* module);

}  // namespace hvd::bindings
