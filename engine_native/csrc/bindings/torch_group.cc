// engine_native.torch's grouped ops in C (issue #20): grouped_allgather, grouped_reducescatter
// and grouped_allreduce (and the single allgather/reducescatter, a group of one) submit a whole
// group in one call and wait for it in one call. In Python every tensor cost ~5 µs (the tensor
// checks, the op tuple, enqueue_group's parsing, one wait() and one (Buffer, shape) tuple per
// handle, then torch.frombuffer(...).view(shape)); here the group costs one call to submit and
// one to wait, and each output one torch.frombuffer (plus a view for shapes of more or fewer
// than one dimension).
//
// Note [Grouped C path]
// torch_group_async takes a group only if every tensor is one the checked Python path would
// accept and submit unchanged: an exact torch.Tensor/Parameter on the CPU, strided, contiguous,
// of a supported dtype (bindings/torch_api.cc, fillTorchOp), its output likewise with the same
// dtype, and a str or absent name. Otherwise it returns None having named and enqueued nothing,
// and the checked path raises Horovod's errors (empty list, bad dtype, non-contiguous, ...) or
// takes the group (CUDA tensors). Names follow the checked path: "<prefix>.<name>" (or the set's
// next noname), "_<i>of<n>" appended per tensor for a grouped op. The tensors stay alive in
// engine_native.torch's handle map (Note [Handle lifetime] in torch/runtime.py).
// torch_group_wait fills a list slot per handle as each finishes (the output tensor, True for
// an op without a core output, or the op's exception), so a wait interrupted by Ctrl-C resumes
// where it stopped and a failed member never hides the others' completion.
// Binding code only; every function runs with the GIL held (the wait releases it).
#include <Python.h>  // first, before any standard header (Python's rule; else zig's newer
                     // glibc headers define _POSIX_C_SOURCE first and pyconfig.h redefines it)

#include <algorithm>
#include <string>
#include <vector>

#include "bindings/buffer.h"
#include "bindings/core_calls.h"
#include "bindings/enqueue_args.h"
#include "bindings/group_core.h"
#include "bindings/torch_api.h"
#include "runtime/runtime.h"

namespace hvd::bindings {
namespace {

using runtime::Runtime;

// Set by torch_group_setup(); references held for the life of the process.
struct GroupSetup {
  PyObject* frombuffer = nullptr;     // torch.frombuffer
  PyObject* empty = nullptr;          // torch.empty
  PyObject* kw_dtype_count = nullptr;  // ("dtype", "count")
  PyObject* kw_dtype = nullptr;        // ("dtype",)
  PyObject* str_view = nullptr;
};
GroupSetup g;

PyObject* pyTorchGroupSetup(PyObject*, PyObject* args) {
  GroupSetup s;
  if (!PyArg_ParseTuple(args, "OO", &s.frombuffer, &s.empty)) return nullptr;
  Py_INCREF(s.frombuffer);
  Py_INCREF(s.empty);
  s.kw_dtype_count = Py_BuildValue("(ss)", "dtype", "count");
  s.kw_dtype = Py_BuildValue("(s)", "dtype");
  s.str_view = PyUnicode_InternFromString("view");
  if (s.kw_dtype_count == nullptr || s.kw_dtype == nullptr || s.str_view == nullptr) {
    return nullptr;
  }
  for (PyObject* o : {g.frombuffer, g.empty, g.kw_dtype_count, g.kw_dtype, g.str_view}) {
    Py_XDECREF(o);
  }
  g = s;  // a second setup replaces the first
  Py_RETURN_NONE;
}

// The arguments of torch_group_async, in order.
enum Arg { kKind, kTensors, kOutputs, kName, kPrefix, kGrouped, kOp, kPre, kPost, kSet, kWaited,
           kArgCount };

// Fills ops[i] from tensors[i] (and outputs[i]); false (perhaps with an error set) when the
// checked path must take the group. dtypes receives each tensor's dtype.
bool fillGroup(PyObject* const* args, int kind, std::vector<runtime::EnqueueArgs>* ops,
               PyObject* dtypes) {
  PyObject* tensors = args[kTensors];
  PyObject* outputs = args[kOutputs];
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(tensors);
  int reduce_op = 0, set_id = 0;
  double prescale = PyFloat_AsDouble(args[kPre]);
  if (prescale == -1.0 && PyErr_Occurred()) return false;
  double postscale = PyFloat_AsDouble(args[kPost]);
  if (postscale == -1.0 && PyErr_Occurred()) return false;
  if (!asCInt(args[kOp], &reduce_op) || !asCInt(args[kSet], &set_id)) return false;
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* tensor = PySequence_Fast_GET_ITEM(tensors, i);
    PyObject* output = outputs == Py_None ? tensor : PySequence_Fast_GET_ITEM(outputs, i);
    runtime::EnqueueArgs& op = (*ops)[static_cast<size_t>(i)];
    PyObject* dtype = nullptr;
    if (!fillTorchOp(tensor, output, &op, &dtype)) return false;
    PyList_SET_ITEM(dtypes, i, dtype);  // steals
    if (outputs == Py_None) op.output = nullptr;  // the core allocates the output
    setReduction(&op.request, static_cast<coord::OpType>(kind), reduce_op, prescale, postscale,
                 set_id);
  }
  return true;
}

// Names the group's ops (Note [Grouped C path]) and enqueues them by the step the numpy API's
// aligned group path shares (bindings/group_core.h); (handles, dtypes) or nullptr with an
// exception (the core's ValueError for a duplicate name, ...).
PyObject* nameAndSubmit(PyObject* const* args, std::vector<runtime::EnqueueArgs> ops,
                        PyObject* dtypes) {
  int set_id = 0;
  if (!asCInt(args[kSet], &set_id)) return nullptr;
  PyObject* base_obj = torchOpName(args[kPrefix], args[kName], set_id);
  if (base_obj == nullptr) return nullptr;
  Py_ssize_t length = 0;
  const char* text = PyUnicode_AsUTF8AndSize(base_obj, &length);
  std::string base = text != nullptr ? std::string(text, static_cast<size_t>(length)) : "";
  Py_DECREF(base_obj);
  if (text == nullptr) return nullptr;
  // waited: the caller's wait drives the group (Note [Caller drives]): each member's wait
  // runs passes until that member ends, and a fused batch ends them all in one.
  const int waited = PyObject_IsTrue(args[kWaited]);
  const int grouped = PyObject_IsTrue(args[kGrouped]);
  if (waited < 0 || grouped < 0) return nullptr;
  PyObject* list = submitNamedGroup(std::move(ops), base, grouped == 1 ? 1 : -1, waited == 1);
  if (list == nullptr) return nullptr;
  Py_INCREF(dtypes);
  return Py_BuildValue("(NN)", list, dtypes);
}

// torch_group_async(kind, tensors, outputs, name, prefix, grouped, op, prescale, postscale,
// set_id, waited) -> (core handles, dtypes), or None when the checked path must take the call.
PyObject* pyTorchGroupAsync(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != kArgCount) {
    PyErr_SetString(PyExc_TypeError,
                    "torch_group_async(kind, tensors, outputs, name, prefix, grouped, op, "
                    "prescale, postscale, set_id, waited)");
    return nullptr;
  }
  if (!torchSetUp() || g.frombuffer == nullptr) {
    PyErr_SetString(PyExc_RuntimeError,
                    "torch_group_async(): torch_setup() and torch_group_setup() were not called");
    return nullptr;
  }
  int kind = 0;
  if (!asCInt(args[kKind], &kind)) return nullptr;
  if (kind != static_cast<int>(coord::OpType::kAllreduce) &&
      kind != static_cast<int>(coord::OpType::kAllgather) &&
      kind != static_cast<int>(coord::OpType::kReducescatter)) {
    PyErr_Format(PyExc_ValueError, "torch_group_async(): op kind %d is not grouped here", kind);
    return nullptr;
  }
  PyObject* tensors = args[kTensors];
  PyObject* outputs = args[kOutputs];
  PyObject* name = args[kName];
  const bool named = name != Py_None && !(PyUnicode_Check(name) && PyUnicode_GET_LENGTH(name) == 0);
  const bool takes_outputs = kind == static_cast<int>(coord::OpType::kAllreduce);
  if (!(PyList_CheckExact(tensors) || PyTuple_CheckExact(tensors)) ||
      (takes_outputs != (outputs != Py_None)) ||
      (outputs != Py_None && !(PyList_CheckExact(outputs) || PyTuple_CheckExact(outputs)))) {
    Py_RETURN_NONE;
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(tensors);
  if (n == 0 || (outputs != Py_None && PySequence_Fast_GET_SIZE(outputs) != n) ||
      (named && !PyUnicode_CheckExact(name)) || !PyUnicode_CheckExact(args[kPrefix]) ||
      !Runtime::instance().initialized()) {
    Py_RETURN_NONE;
  }
  PyObject* dtypes = PyList_New(n);
  if (dtypes == nullptr) return nullptr;
  std::vector<runtime::EnqueueArgs> ops(static_cast<size_t>(n));
  if (!fillGroup(args, kind, &ops, dtypes)) {
    Py_DECREF(dtypes);  // unset items are NULL: list_dealloc skips them
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  PyObject* result = nameAndSubmit(args, std::move(ops), dtypes);
  Py_DECREF(dtypes);
  return result;
}

// A tensor of `dtype` over a host output Buffer, shaped as the result (no copy; the tensor
// keeps the Buffer alive).
PyObject* wrapOutput(const runtime::OpResult& result, PyObject* dtype) {
  if (!result.buffer || result.buffer->device >= 0) {
    PyErr_SetString(PyExc_RuntimeError, "torch_group_wait(): the op gave no host output buffer");
    return nullptr;
  }
  const std::vector<int64_t>& shape = result.shape;
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  if (count == 0) {  // torch.frombuffer refuses an empty buffer
    PyObject* dims = PyTuple_New(static_cast<Py_ssize_t>(shape.size()));
    if (dims == nullptr) return nullptr;
    for (size_t i = 0; i < shape.size(); ++i) {
      PyObject* dim = PyLong_FromLongLong(shape[i]);
      if (dim == nullptr) {
        Py_DECREF(dims);
        return nullptr;
      }
      PyTuple_SET_ITEM(dims, static_cast<Py_ssize_t>(i), dim);
    }
    PyObject* call[] = {dims, dtype};
    PyObject* out = PyObject_Vectorcall(g.empty, call, 1, g.kw_dtype);
    Py_DECREF(dims);
    return out;
  }
  PyObject* buffer = wrapBuffer(result.buffer);
  PyObject* count_obj = PyLong_FromLongLong(count);
  PyObject* flat = nullptr;
  if (buffer != nullptr && count_obj != nullptr) {
    PyObject* call[] = {buffer, dtype, count_obj};
    flat = PyObject_Vectorcall(g.frombuffer, call, 1, g.kw_dtype_count);
  }
  Py_XDECREF(buffer);
  Py_XDECREF(count_obj);
  if (flat == nullptr || shape.size() == 1) return flat;
  // flat.view(*shape), or flat.view(()) for a 0-dim result
  std::vector<PyObject*> call(1 + std::max<size_t>(shape.size(), 1), nullptr);
  call[0] = flat;
  bool ok = true;
  if (shape.empty()) {
    call[1] = PyTuple_New(0);
    ok = call[1] != nullptr;
  }
  for (size_t i = 0; ok && i < shape.size(); ++i) {
    call[i + 1] = PyLong_FromLongLong(shape[i]);
    ok = call[i + 1] != nullptr;
  }
  PyObject* out = ok ? PyObject_VectorcallMethod(g.str_view, call.data(), call.size(), nullptr)
                     : nullptr;
  for (PyObject* o : call) Py_XDECREF(o);
  return out;
}

// torch_group_wait(handles, slots, dtypes) -> the first member's exception, or None. Waits for
// every handle whose slot is None and fills the slot (Note [Grouped C path]): the output
// tensor of dtypes[i], or True when dtypes is None (the outputs are the caller's), by the wait
// loop the numpy API shares (waitGroup, bindings/group_core.h). Raises only when the wait was
// interrupted; the slots filled so far stay filled.
PyObject* pyTorchGroupWait(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 3 || !PyList_CheckExact(args[0]) || !PyList_CheckExact(args[1]) ||
      PyList_GET_SIZE(args[0]) != PyList_GET_SIZE(args[1]) ||
      (args[2] != Py_None &&
       (!PyList_CheckExact(args[2]) || PyList_GET_SIZE(args[2]) != PyList_GET_SIZE(args[0])))) {
    PyErr_SetString(PyExc_TypeError,
                    "torch_group_wait(handles, slots, dtypes): lists of one length (dtypes may "
                    "be None)");
    return nullptr;
  }
  PyObject* dtypes = args[2];
  const bool waited = waitGroup(
      args[0], args[1], [dtypes](Py_ssize_t i, int64_t handle, bool* pending) -> PyObject* {
        common::Status status;
        runtime::OpResult result;
        *pending = !waitResult(handle, &status, &result);  // interrupted: still pending
        if (*pending) return nullptr;
        if (!status.isOk()) return raiseStatus(status);
        if (dtypes == Py_None) return Py_NewRef(Py_True);
        return wrapOutput(result, PyList_GET_ITEM(dtypes, i));
      });
  if (!waited) return nullptr;
  PyObject* failure = firstFailure(args[1]);
  if (failure != nullptr) return Py_NewRef(failure);
  Py_RETURN_NONE;
}

PyMethodDef g_group_methods[] = {
    {"torch_group_setup", pyTorchGroupSetup, METH_VARARGS,
     "torch_group_setup(frombuffer, empty): configure the grouped torch path "
     "(engine_native.torch.grouped calls it)."},
    {"torch_group_async",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pyTorchGroupAsync)),
     METH_FASTCALL,
     "torch_group_async(kind, tensors, outputs, name, prefix, grouped, op, prescale, "
     "postscale, set_id, waited): enqueue a group of plain CPU tensors in one call; returns "
     "(handles, dtypes), or None when the checked path must take the call."},
    {"torch_group_wait",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pyTorchGroupWait)),
     METH_FASTCALL,
     "torch_group_wait(handles, slots, dtypes): wait for a group, filling each slot with its "
     "output (True without dtypes) or its exception; returns the first exception or None."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int addTorchGroupBindings(PyObject* module) {
  return PyModule_AddFunctions(module, g_group_methods);
}

}  // namespace hvd::bindings
