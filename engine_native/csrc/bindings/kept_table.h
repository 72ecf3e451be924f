// What stays alive while the core uses a Python object's memory (Note [Handle lifetime] in
// engine_native/torch/runtime.py), for the per-tensor paths written in C (numpy_api.cc,
// torch_api.cc): by core handle, the objects to keep, the output synchronize returns and an
// optional finish callable. Binding code only; every function runs with the GIL held.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>

#include "runtime/handle_table.h"

namespace hvd::bindings {

// Which C path kept an entry: engine_native.torch forgets its handles at shutdown()/init()
// (as Horovod's handle map does); the numpy API's handles stay synchronizable.
enum class KeptBy { kNumpy, kTorch };

// Holds new references to `keep`, `output` and `finish` (each may be nullptr) until
// synchronizeKept(handle) returns.
void keepRefs(int64_t handle, PyObject* keep, PyObject* output, PyObject* finish, KeptBy by);

// Makes synchronizeKept(handle)'s answer convert(finish, output, the core's result) for an op
// whose output the core may allocate, without the result tuple a Python finish would take
// apart (the numpy API's allgather, alltoall and reducescatter: numpy_gathers.cc). Call after
// keepRefs.
using ResultConverter = PyObject* (*)(PyObject* finish, PyObject* output,
                                      const runtime::OpResult& result);
void convertKeptResult(int64_t handle, ResultConverter convert);

// True while `handle` has references kept (enqueued by a C path and not yet synchronized).
bool isKept(int64_t handle);

// Waits for `handle`, then returns its kept output (or finish(core result)); a handle that
// keeps nothing returns the core's own result. An interrupted wait keeps the references (the
// op is still pending); a failed op drops them. nullptr with a Python exception on failure.
PyObject* synchronizeKept(int64_t handle);

// Drops the references `by` kept: for engine_native.torch's shutdown()/init(), when no op uses
// that memory any more and its handles are forgotten (synchronize returns None for them).
void releaseKept(KeptBy by);

}  // namespace hvd::bindings
