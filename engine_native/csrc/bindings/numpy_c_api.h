// numpy's C API for the binding files that use it. numpy's table of function pointers is one
// per extension module: numpy_api.cc imports it (import_array), the other files only refer to
// it (HVD_NUMPY_IMPORTS_API decides which).
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#define NPY_NO_DEPRECATED_API NPY_1_7_API_VERSION
#define PY_ARRAY_UNIQUE_SYMBOL hvd_numpy_api
#ifndef HVD_NUMPY_IMPORTS_API
#define NO_IMPORT_ARRAY
#endif
#include <numpy/arrayobject.h>
