// The numpy API's per-tensor path in C: allreduce_async() on a plain ndarray, synchronize(), and
// keep() for the checked path; the references live in bindings/kept_table.h (broadcast:
// numpy_broadcast.cc; what both share: numpy_fast_path.h).
// engine_native.numpy_ops configures it once (its dtype table, the checked Python path). Arrays
// are read through numpy's C API: data pointer, dims cost a few loads and an output comes from
// a pool (output_array_pool.h), where the buffer protocol allocated (and later freed) a
// buffer-info record per fresh output and np.empty_like went through Python's call and
// __array_function__ dispatch.
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
#include "bindings/numpy_fast_path.h"
#include "bindings/output_array_pool.h"
#include "runtime/runtime.h"

namespace hvd::bindings {
namespace {

using runtime::Runtime;

// Set by numpy_setup() besides the shared NumpySetup; held for the life of the process.
struct AllreduceSetup {
  PyObject* checked = nullptr;        // numpy_ops._allreduce_async_checked
  PyObject* average = nullptr;        // op 0 (hvd.Average), the default
  PyObject* one = nullptr;            // 1.0, the default scale factors
};
AllreduceSetup g;

PyObject* pyNumpySetup(PyObject*, PyObject* args) {
  NumpySetup s;
  AllreduceSetup a;
  if (!PyArg_ParseTuple(args, "O!OOO", &PyDict_Type, &s.codes, &a.checked, &s.noname,
                        &s.global_set)) {
    return nullptr;
  }
  for (PyObject* o : {s.codes, a.checked, s.noname, s.global_set}) {
    Py_INCREF(o);
  }
  s.str_set_id = PyUnicode_InternFromString("process_set_id");
  a.average = PyLong_FromLong(0);
  a.one = PyFloat_FromDouble(1.0);
  if (s.str_set_id == nullptr || a.average == nullptr || a.one == nullptr) return nullptr;
  setNumpySetup(s);
  g = a;
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

const char* const kArgNames[] = {"array", "op", "name", "prescale_factor", "postscale_factor",
                                 "process_set", "_waited"};
ArgNames g_arg_names{"allreduce_async()", kArgNames, 7, 6};

bool parseAllreduceArgs(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                        AllreduceArgs* out) {
  PyObject* slots[] = {out->array,     out->op,          out->name,  out->prescale,
                       out->postscale, out->process_set, out->waited};
  if (!parseArgs(g_arg_names, args, nargs, kwnames, slots)) return false;
  *out = AllreduceArgs{slots[0], slots[1], slots[2], slots[3], slots[4], slots[5], slots[6]};
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
                                                                           : numpySetup().global_set,
                      a.waited};
  return PyObject_Vectorcall(g.checked, call, 7, nullptr);
}

// Fills the fast path's op; false (no Python error set) when the checked path must decide.
bool fastOp(const AllreduceArgs& a, runtime::EnqueueArgs* op, PyObject** output) {
  PyArrayObject* arr = plainArray(a.array, false);
  if (arr == nullptr) return false;
  int code = 0, set_id = 0, reduce_op = 0;
  double prescale = 1.0, postscale = 1.0;
  if (!dtypeCode(arr, &code)) return false;
  if (a.op != nullptr && !asCInt(a.op, &reduce_op)) return false;
  if ((a.prescale != nullptr && (prescale = PyFloat_AsDouble(a.prescale)) == -1.0 &&
       PyErr_Occurred()) ||
      (a.postscale != nullptr && (postscale = PyFloat_AsDouble(a.postscale)) == -1.0 &&
       PyErr_Occurred())) {
    return false;
  }
  if (!processSetId(a.process_set, &set_id)) return false;
  const int ndim = PyArray_NDIM(arr);
  const npy_intp* dims = PyArray_DIMS(arr);
  op->request.shape.resize(static_cast<size_t>(ndim));
  for (int i = 0; i < ndim; ++i) op->request.shape[i] = static_cast<int64_t>(dims[i]);
  op->input = PyArray_DATA(arr);
  PyObject* out = pooledOutputLike(arr);  // Note [Output array pools]
  if (out == nullptr) return false;
  PyArrayObject* out_arr = plainArray(out, true);
  if (out_arr == nullptr || PyArray_NBYTES(out_arr) != PyArray_NBYTES(arr)) {
    Py_DECREF(out);
    return false;
  }
  op->output = PyArray_DATA(out_arr);
  op->request.dtype = static_cast<common::DataType>(code);
  setReduction(&op->request, coord::OpType::kAllreduce, reduce_op, prescale, postscale, set_id);
  *output = out;
  return true;
}

// allreduce_async(array, op=Average, name=None, prescale_factor=1.0, postscale_factor=1.0,
// process_set=global_process_set, *, _waited=False) -> handle
PyObject* pyAllreduceAsync(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                           PyObject* kwnames) {
  if (numpySetup().codes == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "allreduce_async(): numpy_setup() was not called");
    return nullptr;
  }
  AllreduceArgs a;
  if (!parseAllreduceArgs(args, nargs, kwnames, &a)) return nullptr;
  thread_local std::string full;
  if (!fullName("allreduce", a.name, a.process_set, &full)) return nullptr;
  runtime::EnqueueArgs op;
  PyObject* output = nullptr;
  if (!fastOp(a, &op, &output)) {
    PyErr_Clear();
    PyObject* full_obj = PyUnicode_FromStringAndSize(full.data(), full.size());
    PyObject* handle = full_obj != nullptr ? allreduceChecked(a, full_obj) : nullptr;
    Py_XDECREF(full_obj);
    return handle;
  }
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
     "numpy_setup(codes, checked, noname, global_set): configure the numpy fast path "
     "(engine_native.numpy_ops calls it)."},
    {"output_like", pyOutputLike, METH_O,
     "output_like(array): an uninitialised array like `array` for a result, from the output "
     "pools when one is free (Note [Output array pools])."},
    {"output_pool_counts", pyOutputPoolCounts, METH_NOARGS,
     "output_pool_counts(): arrays the output pools handed out again and made new."},
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
  if (!internArgNames(&g_arg_names)) return -1;
  if (PyModule_AddFunctions(module, g_numpy_methods) < 0) return -1;
  if (addNumpyBroadcastBindings(module) < 0) return -1;
  if (addNumpyGroupBindings(module) < 0) return -1;
  if (addNumpyGatherBindings(module) < 0) return -1;
  if (addJaxHostBindings(module) < 0) return -1;
  return addJaxFfiBindings(module);
}

}  // namespace hvd::bindings
