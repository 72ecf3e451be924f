// Result arrays for small allreduces, handed out again once nobody else holds them
// (Note [Small output pool] in small_output_pool.cc). Binding code: call with the GIL held.
#pragma once

#include "bindings/numpy_c_api.h"

namespace hvd::bindings {

// An uninitialised, writable, C-contiguous array of `descr` and `dims` (a new reference), or
// nullptr with a Python error set.
PyObject* smallOutput(PyArray_Descr* descr, int ndim, const npy_intp* dims);

}  // namespace hvd::bindings
