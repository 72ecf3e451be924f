// The numpy API's per-tensor path (bindings/numpy_api.cc): allreduce_async, synchronize, keep
// and numpy_setup, added to engine_native._core. Binding code only.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace hvd::bindings {

// Adds the functions to the module; -1 with a Python exception on failure.
int addNumpyBindings(PyObject* module);

}  // namespace hvd::bindings
