// Result arrays of the numpy API, handed out again once nobody else holds them (Note [Output
// array pools] in output_array_pool.cc). Binding code: call with the GIL held.
#pragma once

#include "bindings/numpy_c_api.h"

namespace hvd::bindings {

// An uninitialised, writable, C-contiguous array of `array`'s dtype and shape (a new
// reference), from the pool for its size when a free one fits, or nullptr with a Python error
// set. `array` must be C-contiguous.
PyObject* pooledOutputLike(PyArrayObject* array);
// The same for an array of `descr` and the shape `dims` (ndim of them): a result whose shape
// differs from its input's (bindings/numpy_gathers.cc's guesses).
PyObject* pooledOutput(PyArray_Descr* descr, int ndim, const npy_intp* dims);

// output_like(array): pooledOutputLike() of a C-contiguous ndarray; for any other array
// (a subclass, another layout) a fresh np.empty_like. numpy_ops' checked paths call it.
PyObject* pyOutputLike(PyObject* self, PyObject* array);
// output_pool_counts(): {"small_reused", "small_made", "large_reused", "large_made"}: arrays
// each pool handed out again and made new in this process.
PyObject* pyOutputPoolCounts(PyObject* self, PyObject* unused);

}  // namespace hvd::bindings
