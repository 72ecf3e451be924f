// The numpy API's allgather_async(), alltoall_async() and reducescatter_async() in C, like
// allreduce_async() (numpy_api.cc) and broadcast_async() (numpy_broadcast.cc). In Python each
// paid ~2 µs per call more than allreduce: the name, the checks, a finish lambda and, at
// synchronize, the result tuple taken apart by np.frombuffer(...).reshape(...) — as much as
// the whole of a 4 B allreduce between two ranks of one host. Here the core's output becomes
// the result array directly (resultArray below). A plain ndarray of a dtype the core has and a
// registered process set are enqueued here (for alltoall: without splits; for reducescatter:
// an int op and float factors); anything else goes, with the arguments as given, to
// numpy_ops' checked functions, which raise the proper errors. Binding code only; every
// function runs with the GIL held.
#include "bindings/numpy_c_api.h"

#include <string>

#include "bindings/buffer.h"
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

enum Kind { kAllgather, kAlltoall, kReducescatter, kKinds };

struct Op {
  const char* core_name;  // the full name's kind: "allgather.<name>"
  coord::OpType type;
  ArgNames names;
  int name_slot, set_slot, waited_slot;
};

// allgather_async(array, name=None, process_set=global_process_set, *, _waited)
const char* const kAllgatherArgs[] = {"array", "name", "process_set", "_waited"};
// alltoall_async(array, splits=None, name=None, process_set=global_process_set, *, _waited)
const char* const kAlltoallArgs[] = {"array", "splits", "name", "process_set", "_waited"};
// reducescatter_async(array, op=Average, name=None, process_set=global_process_set,
//                     prescale_factor=1.0, postscale_factor=1.0, *, _waited)
const char* const kReducescatterArgs[] = {"array",           "op",          "name",
                                          "process_set",     "prescale_factor",
                                          "postscale_factor", "_waited"};
constexpr int kMaxSlots = 7;
// Inputs up to this size get an output guess (the board's largest, HVD_ONE_ROUND_BYTES' cap).
constexpr npy_intp kGuessedInputBytes = 8192;

Op g_ops[kKinds] = {
    {"allgather", coord::OpType::kAllgather, {"allgather_async()", kAllgatherArgs, 4, 3}, 1, 2,
     3},
    {"alltoall", coord::OpType::kAlltoall, {"alltoall_async()", kAlltoallArgs, 5, 4}, 2, 3, 4},
    {"reducescatter",
     coord::OpType::kReducescatter,
     {"reducescatter_async()", kReducescatterArgs, 7, 6},
     2,
     3,
     6},
};
// numpy_ops' checked functions, set by numpy_gathers_setup().
PyObject* g_checked[kKinds] = {};

PyObject* pyNumpyGathersSetup(PyObject*, PyObject* args) {
  PyObject *allgather = nullptr, *alltoall = nullptr, *reducescatter = nullptr;
  if (!PyArg_ParseTuple(args, "OOO", &allgather, &alltoall, &reducescatter)) return nullptr;
  Py_XSETREF(g_checked[kAllgather], Py_NewRef(allgather));  // a second setup replaces the first
  Py_XSETREF(g_checked[kAlltoall], Py_NewRef(alltoall));
  Py_XSETREF(g_checked[kReducescatter], Py_NewRef(reducescatter));
  Py_RETURN_NONE;
}

// A float argument, or false (no Python error set) when it is not one the fast path takes.
bool asDouble(PyObject* obj, double* out) {
  if (obj == nullptr) return true;  // absent: the default, 1.0
  *out = PyFloat_AsDouble(obj);
  return !(*out == -1.0 && PyErr_Occurred());
}

// Note [Output guesses] in runtime/one_round_ops.cc: an output from the numpy pool the result
// of a small op of the global set most likely fills: size x the input's rows (allgather),
// the input's shape (alltoall of even splits), this rank's rows (reducescatter: the first
// dim0 % size ranks get one more). A new reference in *output, or nullptr without a guess;
// false with a Python error when the pool fails.
bool guessOutput(Kind kind, PyArrayObject* arr, runtime::EnqueueArgs* op, PyObject** output) {
  *output = nullptr;
  const int ndim = PyArray_NDIM(arr);
  const runtime::Runtime& core = Runtime::instance();
  const int size = core.size(), rank = core.rank();
  if (op->request.process_set != 0 || ndim == 0 || size < 1 ||
      PyArray_NBYTES(arr) > kGuessedInputBytes) {
    return true;  // the board takes neither (Note [One round] A): the core allocates
  }
  npy_intp dims[NPY_MAXDIMS];
  for (int i = 0; i < ndim; ++i) dims[i] = PyArray_DIM(arr, i);
  if (kind == kAllgather) dims[0] *= size;
  if (kind == kReducescatter) dims[0] = dims[0] / size + (rank < dims[0] % size ? 1 : 0);
  *output = pooledOutput(PyArray_DESCR(arr), ndim, dims);
  if (*output == nullptr) return false;
  auto* out = reinterpret_cast<PyArrayObject*>(*output);
  op->output = PyArray_DATA(out);
  op->output_bytes = static_cast<size_t>(PyArray_NBYTES(out));
  return true;
}

// The op when the fast path can take it; false (no Python error set) when the checked path
// must decide.
bool fastOp(Kind kind, PyObject* const* slots, runtime::EnqueueArgs* op) {
  PyArrayObject* arr = plainArray(slots[0], false);
  int code = 0, set_id = 0;
  if (arr == nullptr || !dtypeCode(arr, &code) ||
      !processSetId(slots[g_ops[kind].set_slot], &set_id)) {
    return false;
  }
  auto& r = op->request;
  if (kind == kReducescatter) {
    int reduce_op = 0;  // hvd.Average, the default
    double prescale = 1.0, postscale = 1.0;
    if ((slots[1] != nullptr && !asCInt(slots[1], &reduce_op)) || !asDouble(slots[4], &prescale) ||
        !asDouble(slots[5], &postscale)) {
      return false;
    }
    setReduction(&r, coord::OpType::kReducescatter, reduce_op, prescale, postscale, set_id);
  } else {
    if (kind == kAlltoall && slots[1] != Py_None) return false;  // splits: the checked path's
    r.type = g_ops[kind].type;
    r.process_set = set_id;
  }
  const int ndim = PyArray_NDIM(arr);
  const npy_intp* dims = PyArray_DIMS(arr);
  r.shape.resize(static_cast<size_t>(ndim));
  for (int i = 0; i < ndim; ++i) r.shape[i] = static_cast<int64_t>(dims[i]);
  r.dtype = static_cast<common::DataType>(code);
  op->input = PyArray_DATA(arr);
  op->output = nullptr;  // the core's, or a guess (guessOutput)
  return true;
}

// The result as an ndarray of `descr`'s dtype and the result's shape: the guessed `output`
// when the core filled it (no buffer of its own, the same shape), else over the core's buffer,
// which its base keeps alive (what np.frombuffer(buffer, dtype).reshape(shape) made).
PyObject* resultArray(PyObject* descr, PyObject* output, const runtime::OpResult& result) {
  npy_intp dims[NPY_MAXDIMS];
  const int ndim = static_cast<int>(result.shape.size());
  if (ndim > NPY_MAXDIMS) {
    PyErr_Format(PyExc_ValueError, "a result of %d dimensions (numpy allows %d)", ndim,
                 NPY_MAXDIMS);
    return nullptr;
  }
  if (!result.buffer && output != nullptr) {
    auto* guess = reinterpret_cast<PyArrayObject*>(output);
    bool same = PyArray_NDIM(guess) == ndim;
    for (int i = 0; same && i < ndim; ++i) same = PyArray_DIM(guess, i) == result.shape[i];
    if (same) return Py_NewRef(output);
  }
  size_t bytes = static_cast<size_t>(PyDataType_ELSIZE(reinterpret_cast<PyArray_Descr*>(descr)));
  for (int i = 0; i < ndim; ++i) {
    dims[i] = static_cast<npy_intp>(result.shape[i]);
    bytes *= static_cast<size_t>(result.shape[i]);
  }
  const runtime::OutputBuffer* buffer = result.buffer.get();
  if (buffer != nullptr && (buffer->device >= 0 || buffer->bytes < bytes)) {
    PyErr_Format(PyExc_SystemError, "a result of %zu bytes in an output of %zu bytes (device %d)",
                 bytes, buffer->bytes, buffer->device);  // the core broke its own contract
    return nullptr;
  }
  auto* dtype = reinterpret_cast<PyArray_Descr*>(descr);
  Py_INCREF(dtype);  // stolen by the constructors below
  if (buffer == nullptr) return PyArray_Empty(ndim, dims, dtype, 0);  // no output: empty
  if (buffer->data == nullptr) {
    Py_DECREF(dtype);
    return PyErr_NoMemory();
  }
  PyObject* base = wrapBuffer(result.buffer);
  if (base == nullptr) {
    Py_DECREF(dtype);
    return nullptr;
  }
  PyObject* array = PyArray_NewFromDescr(&PyArray_Type, dtype, ndim, dims, nullptr,
                                         buffer->data, NPY_ARRAY_CARRAY, nullptr);
  if (array == nullptr) {
    Py_DECREF(base);
    return nullptr;
  }
  // Steals `base` whether it succeeds or not (numpy releases it on its error paths).
  if (PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(array), base) < 0) {
    Py_DECREF(array);
    return nullptr;
  }
  return array;
}

// alltoall's (received rows, received splits as an int64 array).
PyObject* resultArrayAndSplits(PyObject* descr, PyObject* output,
                               const runtime::OpResult& result) {
  PyObject* rows = resultArray(descr, output, result);
  if (rows == nullptr) return nullptr;
  npy_intp count = static_cast<npy_intp>(result.received_splits.size());
  PyObject* splits = PyArray_SimpleNew(1, &count, NPY_INT64);
  if (splits == nullptr) {
    Py_DECREF(rows);
    return nullptr;
  }
  auto* data = static_cast<int64_t*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(splits)));
  for (npy_intp i = 0; i < count; ++i) data[i] = result.received_splits[i];
  return Py_BuildValue("(NN)", rows, splits);
}

PyObject* enqueueFast(Kind kind, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  const Op& spec = g_ops[kind];
  if (numpySetup().codes == nullptr || g_checked[kind] == nullptr) {
    PyErr_Format(PyExc_RuntimeError, "%s: numpy_setup() was not called", spec.names.function);
    return nullptr;
  }
  PyObject* slots[kMaxSlots] = {};
  slots[spec.name_slot] = Py_None;
  slots[spec.waited_slot] = Py_False;
  if (kind == kAlltoall) slots[1] = Py_None;
  runtime::EnqueueArgs op;
  if (!parseArgs(g_ops[kind].names, args, nargs, kwnames, slots) || !fastOp(kind, slots, &op)) {
    PyErr_Clear();  // the checked path raises the errors, its own way
    return PyObject_Vectorcall(g_checked[kind], args, static_cast<size_t>(nargs), kwnames);
  }
  thread_local std::string full;
  const int waited = PyObject_IsTrue(slots[spec.waited_slot]);
  if (waited < 0 || !fullName(spec.core_name, slots[spec.name_slot], slots[spec.set_slot], &full)) {
    return nullptr;
  }
  auto* arr = reinterpret_cast<PyArrayObject*>(slots[0]);
  PyObject* output = nullptr;  // Note [Output guesses]
  if (!guessOutput(kind, arr, &op, &output)) return nullptr;
  op.name = full;
  int64_t handle = 0;
  const common::Status status = Runtime::instance().enqueue(std::move(op), &handle, !waited);
  if (!status.isOk()) {
    Py_XDECREF(output);
    return raiseStatus(status);
  }
  PyObject* descr = reinterpret_cast<PyObject*>(PyArray_DESCR(arr));
  keepRefs(handle, slots[0], output, descr, KeptBy::kNumpy);
  Py_XDECREF(output);
  convertKeptResult(handle, kind == kAlltoall ? resultArrayAndSplits : resultArray);
  return PyLong_FromLongLong(handle);
}

PyObject* pyAllgatherAsync(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kw) {
  return enqueueFast(kAllgather, args, nargs, kw);
}
PyObject* pyAlltoallAsync(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kw) {
  return enqueueFast(kAlltoall, args, nargs, kw);
}
PyObject* pyReducescatterAsync(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                               PyObject* kw) {
  return enqueueFast(kReducescatter, args, nargs, kw);
}

template <typename F>
PyCFunction fastcall(F f) {
  return reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(f));
}

PyMethodDef g_gather_methods[] = {
    {"numpy_gathers_setup", pyNumpyGathersSetup, METH_VARARGS,
     "numpy_gathers_setup(allgather, alltoall, reducescatter): the checked Python *_async "
     "functions (engine_native.numpy_ops calls it)."},
    {"allgather_async", fastcall(pyAllgatherAsync), METH_FASTCALL | METH_KEYWORDS,
     "allgather_async($module, /, array, name=None, process_set=None)\n--\n\n"
     "Concatenate every rank's `array` along dimension 0 without waiting; returns a handle for "
     "poll()/synchronize(), whose result is a new array."},
    {"alltoall_async", fastcall(pyAlltoallAsync), METH_FASTCALL | METH_KEYWORDS,
     "alltoall_async($module, /, array, splits=None, name=None, process_set=None)\n--\n\n"
     "Send splits[r] rows to rank r without waiting; synchronize() returns (received rows, "
     "received splits)."},
    {"reducescatter_async", fastcall(pyReducescatterAsync), METH_FASTCALL | METH_KEYWORDS,
     "reducescatter_async($module, /, array, op=0, name=None, process_set=None, "
     "prescale_factor=1.0, postscale_factor=1.0)\n--\n\nReduce across ranks and give each its "
     "slice of dimension 0, without waiting; synchronize() returns a new array."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int addNumpyGatherBindings(PyObject* module) {
  for (Op& op : g_ops) {
    if (!internArgNames(&op.names)) return -1;
  }
  return PyModule_AddFunctions(module, g_gather_methods);
}

}  // namespace hvd::bindings
