// The numpy API's per-tensor path in C: allreduce_async() on a plain ndarray, synchronize(), and
// keep() for the checked path; the references live in bindings/kept_table.h.
// engine_native.numpy_ops configures it once (its dtype table, the output pool for large
// arrays, the checked Python path). Arrays are read through numpy's C API: data pointer, dims
// cost a few loads and an output comes from a pool (small_output_pool.h, or numpy_ops' for
// large arrays), where the buffer protocol allocated (and later freed) a buffer-info record per
// fresh output and np.empty_like went through Python's call and __array_function__ dispatch.
// Anything the fast path does not handle itself — another array type, a foreign or non-native
// dtype, a non-contiguous array, an unregistered process set — goes to the checked path, which
// raises the proper errors; nothing is enqueued before that decision. Binding code only; every
// function runs with the GIL held (synchronize releases it while it waits).
#define HVD_NUMPY_IMPORTS_API  // this file's import_array fills numpy's table for the module
#include "bindings/numpy_c_api.h"

#include <string>
#include <vector>

#include "bindings/core_calls.h"
#include "bindings/enqueue_args.h"
#include "bindings/kept_table.h"
#include "bindings/numpy_api.h"
#include "bindings/small_output_pool.h"
#include "runtime/runtime.h"

namespace hvd::bindings {
namespace {

using runtime::Runtime;

// Set by numpy_setup(); references held for the life of the process.
struct Setup {
  PyObject* codes = nullptr;          // {numpy dtype: core dtype code}
  PyObject* output_like = nullptr;    // numpy_ops._output_like (pooled large outputs)
  PyObject* checked = nullptr;        // numpy_ops._allreduce_async_checked
  PyObject* noname = nullptr;         // numpy_ops._full_name
  PyObject* global_set = nullptr;     // basics.global_process_set
  Py_ssize_t pool_min_bytes = 0;
  PyObject* average = nullptr;        // op 0 (hvd.Average), the default
  PyObject* one = nullptr;            // 1.0, the default scale factors
  PyObject* str_set_id = nullptr;
};
Setup g;

PyObject* pyNumpySetup(PyObject*, PyObject* args) {
  Setup s;
  if (!PyArg_ParseTuple(args, "O!OOOOn", &PyDict_Type, &s.codes, &s.output_like, &s.checked,
                        &s.noname, &s.global_set, &s.pool_min_bytes)) {
    return nullptr;
  }
  for (PyObject* o : {s.codes, s.output_like, s.checked, s.noname, s.global_set}) {
    Py_INCREF(o);
  }
  s.str_set_id = PyUnicode_InternFromString("process_set_id");
  s.average = PyLong_FromLong(0);
  s.one = PyFloat_FromDouble(1.0);
  if (s.str_set_id == nullptr || s.average == nullptr || s.one == nullptr) return nullptr;
  g = s;
  Py_RETURN_NONE;
}

PyObject* pyKeep(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "keep(handle, keepalive, output, finish)");
    return nullptr;
  }
  const long long handle = PyLong_AsLongLong(args[0]);
  if (handle == -1 && PyErr_Occurred()) return nullptr;
  keepRefs(handle, args[1], args[2] == Py_None ? nullptr : args[2],
           args[3] == Py_None ? nullptr : args[3], KeptBy::kNumpy);
  Py_RETURN_NONE;
}

// The arguments of allreduce_async(array, op, name, prescale_factor, postscale_factor,
// process_set, *, _waited), borrowed.
struct AllreduceArgs {
  PyObject* array = nullptr;
  PyObject* op = nullptr;
  PyObject* name = Py_None;
  PyObject* prescale = nullptr;
  PyObject* postscale = nullptr;
  PyObject* process_set = nullptr;
  PyObject* waited = Py_False;
};

constexpr int kArgCount = 7;
const char* const kArgNames[kArgCount] = {"array", "op", "name", "prescale_factor",
                                          "postscale_factor", "process_set", "_waited"};
PyObject* g_arg_names[kArgCount];  // interned: keyword names usually compare by identity

int argIndex(PyObject* key) {
  for (int i = 0; i < kArgCount; ++i) {
    if (key == g_arg_names[i]) return i;
  }
  for (int i = 0; i < kArgCount; ++i) {
    if (PyUnicode_Compare(key, g_arg_names[i]) == 0) return i;
  }
  return kArgCount;
}

bool parseAllreduceArgs(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                        AllreduceArgs* out) {
  PyObject** slots[] = {&out->array, &out->op, &out->name, &out->prescale,
                        &out->postscale, &out->process_set, &out->waited};
  if (nargs > 6) {
    PyErr_SetString(PyExc_TypeError, "allreduce_async() takes at most 6 positional arguments");
    return false;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) *slots[i] = args[i];
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    const int i = argIndex(key);
    if (i == kArgCount || i < nargs) {
      PyErr_Format(PyExc_TypeError, "allreduce_async() got %s keyword argument '%U'",
                   i == kArgCount ? "an unexpected" : "a repeated", key);
      return false;
    }
    *slots[i] = args[nargs + k];
  }
  if (out->array == nullptr) {
    PyErr_SetString(PyExc_TypeError, "allreduce_async() missing required argument 'array'");
    return false;
  }
  return true;
}

// The checked Python path, with the arguments as given (defaults filled in, the name completed
// to the full name).
PyObject* allreduceChecked(const AllreduceArgs& a, PyObject* full_name) {
  PyObject* call[] = {a.array,
                      a.op != nullptr ? a.op : g.average,
                      full_name,
                      a.prescale != nullptr ? a.prescale : g.one,
                      a.postscale != nullptr ? a.postscale : g.one,
                      a.process_set != nullptr && a.process_set != Py_None ? a.process_set
                                                                           : g.global_set,
                      a.waited};
  return PyObject_Vectorcall(g.checked, call, 7, nullptr);
}

// A C-contiguous, aligned, native-order ndarray (exactly that type): what the core can use.
PyArrayObject* plainArray(PyObject* obj, bool writable) {
  if (!PyArray_CheckExact(obj)) return nullptr;
  auto* arr = reinterpret_cast<PyArrayObject*>(obj);
  const int need = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | (writable ? NPY_ARRAY_WRITEABLE : 0);
  if (!PyArray_CHKFLAGS(arr, need) || !PyArray_ISNOTSWAPPED(arr)) return nullptr;
  return arr;
}

// Fills the fast path's op; false (no Python error set) when the checked path must decide.
bool fastOp(const AllreduceArgs& a, runtime::EnqueueArgs* op, PyObject** output) {
  PyArrayObject* arr = plainArray(a.array, false);
  if (arr == nullptr) return false;
  int code = 0, set_id = 0, reduce_op = 0;
  double prescale = 1.0, postscale = 1.0;
  PyObject* code_obj =
      PyDict_GetItemWithError(g.codes, reinterpret_cast<PyObject*>(PyArray_DESCR(arr)));
  if (code_obj == nullptr) return false;  // borrowed
  code = static_cast<int>(PyLong_AsLong(code_obj));
  if (a.op != nullptr && !asCInt(a.op, &reduce_op)) return false;
  if ((a.prescale != nullptr && (prescale = PyFloat_AsDouble(a.prescale)) == -1.0 &&
       PyErr_Occurred()) ||
      (a.postscale != nullptr && (postscale = PyFloat_AsDouble(a.postscale)) == -1.0 &&
       PyErr_Occurred())) {
    return false;
  }
  if (a.process_set != nullptr && a.process_set != Py_None && a.process_set != g.global_set) {
    PyObject* id = PyObject_GetAttr(a.process_set, g.str_set_id);
    if (id == nullptr) return false;
    const bool ok = id != Py_None && asCInt(id, &set_id);
    Py_DECREF(id);
    if (!ok || set_id < 0) return false;  // unregistered (None) or not an int
  }
  const int ndim = PyArray_NDIM(arr);
  const npy_intp* dims = PyArray_DIMS(arr);
  op->request.shape.resize(static_cast<size_t>(ndim));
  for (int i = 0; i < ndim; ++i) op->request.shape[i] = static_cast<int64_t>(dims[i]);
  op->input = PyArray_DATA(arr);
  PyObject* out = nullptr;
  if (PyArray_NBYTES(arr) < g.pool_min_bytes) {
    out = smallOutput(PyArray_DESCR(arr), ndim, dims);  // Note [Small output pool]
  } else {
    out = PyObject_Vectorcall(g.output_like, &a.array, 1, nullptr);  // the pool
  }
  if (out == nullptr) return false;
  PyArrayObject* out_arr = plainArray(out, true);
  if (out_arr == nullptr || PyArray_NBYTES(out_arr) != PyArray_NBYTES(arr)) {
    Py_DECREF(out);
    return false;
  }
  op->output = PyArray_DATA(out_arr);
  auto& r = op->request;
  r.type = coord::OpType::kAllreduce;
  r.dtype = static_cast<common::DataType>(code);
  r.reduce_op = static_cast<common::ReduceOp>(reduce_op);
  r.prescale = prescale;
  r.postscale = postscale;
  r.process_set = set_id;
  *output = out;
  return true;
}

// allreduce_async(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
// process_set=global_process_set, *, _waited=False) -> handle
PyObject* pyAllreduceAsync(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                           PyObject* kwnames) {
  if (g.codes == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "allreduce_async(): numpy_setup() was not called");
    return nullptr;
  }
  AllreduceArgs a;
  if (!parseAllreduceArgs(args, nargs, kwnames, &a)) return nullptr;
  // Horovod's tensor name: "allreduce.<name>", or "allreduce.noname.<n>" from the counter.
  thread_local std::string full;
  PyObject* full_obj = nullptr;  // only built for the checked path or a missing name
  Py_ssize_t name_len = 0;
  const int named = PyObject_IsTrue(a.name);  // as the Python API: None and "" are unnamed
  if (named < 0) return nullptr;
  if (named == 1) {
    PyObject* text_obj = PyObject_Str(a.name);  // the same object for a str
    const char* text =
        text_obj != nullptr ? PyUnicode_AsUTF8AndSize(text_obj, &name_len) : nullptr;
    if (text != nullptr) {
      full.assign("allreduce.");
      full.append(text, static_cast<size_t>(name_len));
    }
    Py_XDECREF(text_obj);
    if (text == nullptr) return nullptr;
  } else {
    // The counter of the op's set (Note [Noname counters] in torch/runtime.py).
    PyObject* set = a.process_set != nullptr ? a.process_set : Py_None;
    PyObject* call[] = {PyUnicode_FromString("allreduce"), Py_None, set};
    full_obj = call[0] != nullptr ? PyObject_Vectorcall(g.noname, call, 3, nullptr) : nullptr;
    Py_XDECREF(call[0]);
    const char* text = full_obj != nullptr ? PyUnicode_AsUTF8AndSize(full_obj, &name_len)
                                           : nullptr;
    if (text == nullptr) {
      Py_XDECREF(full_obj);
      return nullptr;
    }
    full.assign(text, static_cast<size_t>(name_len));
  }
  runtime::EnqueueArgs op;
  PyObject* output = nullptr;
  if (!fastOp(a, &op, &output)) {
    PyErr_Clear();
    if (full_obj == nullptr) full_obj = PyUnicode_FromStringAndSize(full.data(), full.size());
    PyObject* handle = full_obj != nullptr ? allreduceChecked(a, full_obj) : nullptr;
    Py_XDECREF(full_obj);
    return handle;
  }
  Py_XDECREF(full_obj);
  op.name = full;
  int64_t handle = 0;
  const int waited = PyObject_IsTrue(a.waited);
  if (waited < 0) {
    Py_DECREF(output);
    return nullptr;
  }
  common::Status status = Runtime::instance().enqueue(std::move(op), &handle, !waited);
  if (!status.isOk()) {
    Py_DECREF(output);
    return raiseStatus(status);
  }
  keepRefs(handle, a.array, output, nullptr, KeptBy::kNumpy);
  Py_DECREF(output);
  return PyLong_FromLongLong(handle);
}

// synchronize(handle): waits, then returns the kept output, or finish(core result).
PyObject* pySynchronize(PyObject*, PyObject* arg) {
  const long long handle = PyLong_AsLongLong(arg);
  if (handle == -1 && PyErr_Occurred()) return nullptr;
  return synchronizeKept(handle);
}

PyMethodDef g_numpy_methods[] = {
    {"numpy_setup", pyNumpySetup, METH_VARARGS,
     "numpy_setup(codes, output_like, checked, noname, global_set, pool_min_bytes): configure "
     "the numpy fast path (engine_native.numpy_ops calls it)."},
    {"keep", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pyKeep)), METH_FASTCALL,
     "keep(handle, keepalive, output, finish): hold references until synchronize(handle)."},
    {"allreduce_async",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pyAllreduceAsync)),
     METH_FASTCALL | METH_KEYWORDS,
     "allreduce_async($module, /, array, op=0, name=None, prescale_factor=1.0, "
     "postscale_factor=1.0, process_set=None)\n--\n\nReduce `array` across ranks without "
     "waiting (op 0 is hvd.Average; process_set None is the global set); returns a handle for "
     "poll()/synchronize(), whose result is a new array."},
    {"synchronize", pySynchronize, METH_O,
     "synchronize($module, handle, /)\n--\n\nWait for an async op and return its result "
     "(raises its error)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int addNumpyBindings(PyObject* module) {
  import_array1(-1);  // numpy's C API table (numpy is a dependency of engine_native)
  for (int i = 0; i < kArgCount; ++i) {
    g_arg_names[i] = PyUnicode_InternFromString(kArgNames[i]);
    if (g_arg_names[i] == nullptr) return -1;
  }
  return PyModule_AddFunctions(module, g_numpy_methods);
}

}  // namespace hvd::bindings
