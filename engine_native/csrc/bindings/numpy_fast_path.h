// What the numpy API's C functions share (bindings/numpy_api.cc: allreduce; numpy_broadcast.cc:
// broadcast): the configuration numpy_setup() stores, keyword parsing, and the checks that
// decide whether an array can take the fast path. Each check returns false with no Python error
// set when the checked Python path must decide (it raises the proper errors), or with one set
// when the call itself is wrong. Binding code only; every function runs with the GIL held.
#pragma once

#include "bindings/numpy_c_api.h"

#include <string>

namespace hvd::bindings {

// Set by numpy_setup(); references held for the life of the process.
struct NumpySetup {
  PyObject* codes = nullptr;          // {numpy dtype: core dtype code}
  PyObject* noname = nullptr;         // numpy_ops._full_name
  PyObject* global_set = nullptr;     // basics.global_process_set
  PyObject* str_set_id = nullptr;     // "process_set_id"
};
// Null codes until numpy_setup() ran.
const NumpySetup& numpySetup();
void setNumpySetup(const NumpySetup& setup);

// A function's keyword names, interned once: keywords usually compare by identity.
struct ArgNames {
  const char* function;               // for the error messages: "broadcast_async()"
  const char* const* names;
  int count;
  int max_positional;
  PyObject* interned[8] = {};
};
bool internArgNames(ArgNames* names);
// Vectorcall arguments into slots[0..count) (borrowed; slots keep their defaults when absent).
// TypeError for too many positional, unknown or repeated keywords, or a missing slot 0.
bool parseArgs(ArgNames& names, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
               PyObject** slots);

// A C-contiguous, aligned, native-order ndarray (exactly that type): what the core can use.
PyArrayObject* plainArray(PyObject* obj, bool writable);
// The core's dtype code of a plain array; false for a dtype the core lacks.
bool dtypeCode(PyArrayObject* array, int* code);
// The id of a registered process set (null or None: the global set, 0).
bool processSetId(PyObject* process_set, int* id);
// Horovod's tensor name: "<kind>.<name>", or "<kind>.noname.<n>" from the counter of the op's
// set (Note [Noname counters] in torch/runtime.py). None and "" are unnamed.
bool fullName(const char* kind, PyObject* name, PyObject* process_set, std::string* full);

}  // namespace hvd::bindings
