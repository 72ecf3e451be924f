// Argument conversion for the enqueue functions of engine_native._core (bindings/module.cc).
// Binding code only; every function is called with the GIL held and sets a Python exception
// when it returns false.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <vector>

#include "runtime/runtime.h"

namespace hvd::bindings {

// A Python int as a C int: OverflowError out of range (never a silent wrap), TypeError when it
// is not an int.
bool asCInt(PyObject* obj, int* out);
// A sequence of ints (shape, splits, ranks).
bool toInt64List(PyObject* seq, std::vector<int64_t>* out, const char* what);
bool toInt64List(PyObject* seq, hvd::coord::Shape* out, const char* what);
// enqueue(kind, name, dtype, shape, input, output[, reduce_op, prescale, postscale, root,
// process_set, splits, device]) in vectorcall form (positional fast path; keywords allowed).
bool parseEnqueueArgs(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                      hvd::runtime::EnqueueArgs* op);
// The same arguments as a tuple (one op of enqueue_group()).
bool parseEnqueueTuple(PyObject* tuple, hvd::runtime::EnqueueArgs* op);

// A reduction's parameters, as the C group paths (numpy_api, numpy_group, torch_group) set them.
inline void setReduction(hvd::coord::Request* r, hvd::coord::OpType type, int reduce_op,
                         double prescale, double postscale, int32_t process_set) {
  r->type = type;
  r->reduce_op = static_cast<hvd::common::ReduceOp>(reduce_op);
  r->prescale = prescale;
  r->postscale = postscale;
  r->process_set = process_set;
}

}  // namespace hvd::bindings
