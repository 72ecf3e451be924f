// engine_native.torch's per-tensor allreduce path (bindings/torch_api.cc): torch_setup,
// torch_allreduce_async, torch_synchronize, torch_kept and torch_release_kept, added to
// engine_native._core.
// Binding code only.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "runtime/runtime.h"

namespace hvd::bindings {

// Adds the functions to the module; -1 with a Python exception on failure.
int addTorchBindings(PyObject* module);
// The grouped path's functions (bindings/torch_group.cc); -1 with a Python exception.
int addTorchGroupBindings(PyObject* module);

// For the grouped path (bindings/torch_group.cc), sharing torch_setup()'s tables:
// True once torch_setup() ran.
bool torchSetUp();
// Fills `op` (dtype, shape, addresses) from an exact torch.Tensor/Parameter on the CPU, strided,
// contiguous, of a supported dtype, and its output (`tensor` itself in place); `dtype`, when
// given, receives a new reference to its dtype. False (perhaps with an error set, which the
// caller clears) when the checked Python path must decide.
bool fillTorchOp(PyObject* tensor, PyObject* output, runtime::EnqueueArgs* op,
                 PyObject** dtype);
// runtime.op_name(prefix, name, set_id): Horovod's full name, an unnamed op taking the next n
// of its set's counter. A new reference, or nullptr with an exception.
PyObject* torchOpName(PyObject* prefix, PyObject* name, int set_id);

}  // namespace hvd::bindings
