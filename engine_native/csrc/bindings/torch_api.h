// engine_native.torch's per-tensor allreduce path (bindings/torch_api.cc): torch_setup,
// torch_allreduce_async, torch_synchronize, torch_kept and torch_release_kept, added to
// engine_native._core.
// Binding code only.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace hvd::bindings {

// Adds the functions to the module; -1 with a Python exception on failure.
int addTorchBindings(PyObject* module);

}  // namespace hvd::bindings
