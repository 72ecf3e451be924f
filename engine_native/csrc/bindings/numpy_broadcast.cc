// The numpy API's broadcast_async() and broadcast_async_() in C, like allreduce_async()
// (numpy_api.cc): broadcast_parameters-style loops and small broadcasts paid ~0.7 µs per call
// more in Python than allreduce (the name, the checks, the output, the keep tuple), about a
// sixth of a 4 B broadcast between two ranks. A plain ndarray of a dtype the core has, an int
// root and a registered process set are enqueued here; anything else goes, with the arguments
// as given, to numpy_ops' checked functions, which raise the proper errors. Binding code only;
// every function runs with the GIL held.
#include "bindings/numpy_c_api.h"

#include <string>

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

// numpy_ops' checked broadcast_async and broadcast_async_, set by numpy_broadcast_setup().
PyObject* g_checked_copy = nullptr;
PyObject* g_checked_in_place = nullptr;

PyObject* pyNumpyBroadcastSetup(PyObject*, PyObject* args) {
  PyObject *copy = nullptr, *in_place = nullptr;
  if (!PyArg_ParseTuple(args, "OO", &copy, &in_place)) return nullptr;
  Py_XSETREF(g_checked_copy, Py_NewRef(copy));  // a second setup replaces the first
  Py_XSETREF(g_checked_in_place, Py_NewRef(in_place));
  Py_RETURN_NONE;
}

// broadcast_async(array, root_rank, name=None, process_set=global_process_set, *, _waited).
const char* const kArgNames[] = {"array", "root_rank", "name", "process_set", "_waited"};
ArgNames g_copy_names{"broadcast_async()", kArgNames, 5, 4};
ArgNames g_in_place_names{"broadcast_async_()", kArgNames, 5, 4};

// The op when the fast path can take it; false (no Python error set) when the checked path
// must decide. In place, the array is input and output (the root only reads it).
bool fastOp(PyObject* const* slots, bool in_place, runtime::EnqueueArgs* op,
            PyObject** output) {
  PyObject *array_obj = slots[0], *root_obj = slots[1];
  PyArrayObject* arr = plainArray(array_obj, in_place);
  int code = 0, root = 0, set_id = 0;
  if (arr == nullptr || root_obj == nullptr || !dtypeCode(arr, &code) ||
      !asCInt(root_obj, &root) || !processSetId(slots[3], &set_id)) {
    return false;
  }
  PyObject* out = array_obj;
  if (in_place) {
    Py_INCREF(out);
  } else {
    out = pooledOutputLike(arr);  // Note [Output array pools]
    PyArrayObject* out_arr = out != nullptr ? plainArray(out, true) : nullptr;
    if (out_arr == nullptr || PyArray_NBYTES(out_arr) != PyArray_NBYTES(arr)) {
      Py_XDECREF(out);
      return false;
    }
  }
  const int ndim = PyArray_NDIM(arr);
  const npy_intp* dims = PyArray_DIMS(arr);
  auto& r = op->request;
  r.shape.resize(static_cast<size_t>(ndim));
  for (int i = 0; i < ndim; ++i) r.shape[i] = static_cast<int64_t>(dims[i]);
  r.type = coord::OpType::kBroadcast;
  r.dtype = static_cast<common::DataType>(code);
  r.root_rank = root;
  r.process_set = set_id;
  op->input = PyArray_DATA(arr);
  op->output = PyArray_DATA(reinterpret_cast<PyArrayObject*>(out));
  *output = out;
  return true;
}

PyObject* broadcastAsync(bool in_place, PyObject* const* args, Py_ssize_t nargs,
                         PyObject* kwnames) {
  PyObject* checked = in_place ? g_checked_in_place : g_checked_copy;
  if (numpySetup().codes == nullptr || checked == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "broadcast_async(): numpy_setup() was not called");
    return nullptr;
  }
  PyObject* slots[] = {nullptr, nullptr, Py_None, nullptr, Py_False};
  runtime::EnqueueArgs op;
  PyObject* output = nullptr;
  if (!parseArgs(in_place ? g_in_place_names : g_copy_names, args, nargs, kwnames, slots) ||
      !fastOp(slots, in_place, &op, &output)) {
    PyErr_Clear();  // the checked path raises the errors, its own way
    return PyObject_Vectorcall(checked, args, static_cast<size_t>(nargs), kwnames);
  }
  thread_local std::string full;
  const int waited = PyObject_IsTrue(slots[4]);
  if (waited < 0 || !fullName("broadcast", slots[2], slots[3], &full)) {
    Py_DECREF(output);
    return nullptr;
  }
  op.name = full;
  int64_t handle = 0;
  common::Status status = Runtime::instance().enqueue(std::move(op), &handle, !waited);
  if (!status.isOk()) {
    Py_DECREF(output);
    return raiseStatus(status);
  }
  keepRefs(handle, slots[0], output, nullptr, KeptBy::kNumpy);
  Py_DECREF(output);
  return PyLong_FromLongLong(handle);
}

PyObject* pyBroadcastAsync(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                           PyObject* kwnames) {
  return broadcastAsync(false, args, nargs, kwnames);
}

PyObject* pyBroadcastAsyncInPlace(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                                  PyObject* kwnames) {
  return broadcastAsync(true, args, nargs, kwnames);
}

PyMethodDef g_broadcast_methods[] = {
    {"numpy_broadcast_setup", pyNumpyBroadcastSetup, METH_VARARGS,
     "numpy_broadcast_setup(checked, checked_in_place): the checked Python broadcast_async and "
     "broadcast_async_ (engine_native.numpy_ops calls it)."},
    {"broadcast_async",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pyBroadcastAsync)),
     METH_FASTCALL | METH_KEYWORDS,
     "broadcast_async($module, /, array, root_rank, name=None, process_set=None)\n--\n\n"
     "Send root_rank's `array` to every rank without waiting (process_set None is the global "
     "set); returns a handle for poll()/synchronize(), whose result is a new array."},
    {"broadcast_async_",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pyBroadcastAsyncInPlace)),
     METH_FASTCALL | METH_KEYWORDS,
     "broadcast_async_($module, /, array, root_rank, name=None, process_set=None)\n--\n\n"
     "In-place broadcast_async: `array` itself receives the root's values (on the root it is "
     "only read). Like engine_native.torch.broadcast_; no output is allocated. `array` must be "
     "a writable, contiguous numpy array on every rank (the root included); synchronize() "
     "returns it."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int addNumpyBroadcastBindings(PyObject* module) {
  if (!internArgNames(&g_copy_names) || !internArgNames(&g_in_place_names)) return -1;
  return PyModule_AddFunctions(module, g_broadcast_methods);
}

}  // namespace hvd::bindings
