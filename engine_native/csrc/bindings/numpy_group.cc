// The numpy API's grouped allreduce into aligned outputs, in C (issue #37): what engine_native.jax
// runs for every eager grouped allreduce (a gradient pytree each step). aligned_like() carves
// the 64-byte aligned result views that XLA's CPU client adopts without a copy (the mechanism
// engine_native.aligned_buffers documents); grouped_allreduce_aligned() checks, names and
// enqueues a whole group in one call and keeps each member's input and output in the kept table
// (bindings/kept_table.h); synchronize_group() waits for every member in one call. Measured
// 2026-12-05 on benchmarks/bench_jax.py's 20-array gradient pytree, one process, medians of
// in-step spans: numpy_ops' Python took 44 us to build and submit the op tuples and 35 us to
// carve the views; this path takes 28 us for both (the core's enqueue included).
//
// Note [Aligned group path]
// grouped_allreduce_aligned takes a group only if numpy_ops' checked path would accept it and
// submit it unchanged: a non-empty list or tuple of plain ndarrays (exactly that type,
// C-contiguous, aligned, native byte order: numpy_fast_path.h) of dtypes the core has, an int op,
// float scale factors, and a registered process set (None: the global set). Otherwise it returns
// None having named and enqueued nothing, and the checked path raises the numpy API's errors
// (an unregistered process set, a non-contiguous array, ...) or takes the group. Names follow the
// checked path: "grouped_allreduce.<name>" (or the set's next noname) with "_<i>of<n>" appended,
// i from 0. Binding code only; every function runs with the GIL held (the waits release it).
#include "bindings/numpy_c_api.h"

#include <cstdint>
#include <string>
#include <vector>

#include "bindings/enqueue_args.h"
#include "bindings/group_core.h"
#include "bindings/kept_table.h"
#include "bindings/numpy_api.h"
#include "bindings/numpy_fast_path.h"
#include "runtime/runtime.h"

namespace hvd::bindings {
namespace {

constexpr npy_intp kAlignment = 64;  // XLA's CPU client and TF adopt a buffer aligned to this

// The dtype and shape of one item of aligned_like(): an ndarray's own, or the `dtype` and
// `shape` attributes of anything else (a numpy scalar, which tf.numpy_function passes for a
// 0-d tensor). False with a TypeError when it has neither, or a dtype holding references; a
// KeyboardInterrupt (no Exception) raised by those attributes propagates as it is.
struct Like {
  PyArray_Descr* descr = nullptr;  // a new reference
  std::vector<npy_intp> dims;
  npy_intp nbytes = 0;
};

bool likeOf(PyObject* item, Py_ssize_t i, Like* like) {
  if (PyArray_Check(item)) {
    auto* array = reinterpret_cast<PyArrayObject*>(item);
    like->descr = PyArray_DESCR(array);
    Py_INCREF(like->descr);
    like->dims.assign(PyArray_DIMS(array), PyArray_DIMS(array) + PyArray_NDIM(array));
  } else {
    PyObject* dtype = PyObject_GetAttrString(item, "dtype");
    const bool ok = dtype != nullptr && PyArray_DescrConverter(dtype, &like->descr) == NPY_SUCCEED;
    Py_XDECREF(dtype);
    PyObject* shape = ok ? PyObject_GetAttrString(item, "shape") : nullptr;
    PyObject* fast = shape != nullptr ? PySequence_Fast(shape, "shape") : nullptr;
    Py_XDECREF(shape);
    for (Py_ssize_t d = 0; fast != nullptr && d < PySequence_Fast_GET_SIZE(fast); ++d) {
      like->dims.push_back(PyNumber_AsSsize_t(PySequence_Fast_GET_ITEM(fast, d), nullptr));
    }
    const bool dims_ok = fast != nullptr && !PyErr_Occurred();
    Py_XDECREF(fast);
    if (!dims_ok) Py_CLEAR(like->descr);
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) return false;  // Ctrl-C
    PyErr_Clear();
  }
  for (npy_intp d : like->dims) {
    if (d < 0) Py_CLEAR(like->descr);
  }
  if (like->descr == nullptr || PyDataType_REFCHK(like->descr)) {
    PyErr_Format(PyExc_TypeError, "aligned_like(arrays): item %zd has no plain (non-object) "
                 "dtype and shape", i);
    return false;
  }
  like->nbytes = static_cast<npy_intp>(PyDataType_ELSIZE(like->descr));
  for (npy_intp d : like->dims) like->nbytes *= d;
  return true;
}

npy_intp padded(npy_intp nbytes) { return (nbytes + kAlignment - 1) / kAlignment * kAlignment; }

// Uninitialised views of one new buffer, one per item of `arrays` (a tuple of numpy arrays, or
// of anything with a dtype and a shape), each with that item's dtype and shape, C-contiguous,
// writable and kAlignment-byte aligned, carved in order. A new list, or nullptr with a TypeError
// for an item without them. A tuple, not the caller's list: likeOf() runs Python (a property),
// which could replace or remove a list's items while we hold them borrowed.
PyObject* alignedLike(PyObject* arrays) {
  const Py_ssize_t n = PyTuple_GET_SIZE(arrays);
  std::vector<Like> likes(static_cast<size_t>(n));
  npy_intp total = kAlignment;  // slack to align the first view
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < n; ++i) {
    Like& like = likes[static_cast<size_t>(i)];
    ok = likeOf(PyTuple_GET_ITEM(arrays, i), i, &like);
    total += padded(like.nbytes);
  }
  PyObject* raw = ok ? PyArray_SimpleNew(1, &total, NPY_UINT8) : nullptr;
  char* data = raw != nullptr
                   ? static_cast<char*>(PyArray_DATA(reinterpret_cast<PyArrayObject*>(raw)))
                   : nullptr;
  npy_intp offset = (kAlignment - reinterpret_cast<uintptr_t>(data) % kAlignment) % kAlignment;
  PyObject* views = raw != nullptr ? PyList_New(n) : nullptr;
  for (Py_ssize_t i = 0; views != nullptr && i < n; ++i) {
    Like& like = likes[static_cast<size_t>(i)];
    PyObject* view = PyArray_NewFromDescr(  // steals the descr
        &PyArray_Type, like.descr, static_cast<int>(like.dims.size()), like.dims.data(),
        nullptr, data + offset, NPY_ARRAY_CARRAY, nullptr);
    like.descr = nullptr;
    Py_INCREF(raw);  // the view's base (stolen), which keeps the buffer alive
    if (view == nullptr ||
        PyArray_SetBaseObject(reinterpret_cast<PyArrayObject*>(view), raw) < 0) {
      if (view == nullptr) Py_DECREF(raw);
      Py_XDECREF(view);
      Py_CLEAR(views);  // unset items are NULL, which list dealloc skips
      break;
    }
    PyList_SET_ITEM(views, i, view);
    offset += padded(like.nbytes);
  }
  for (Like& like : likes) Py_XDECREF(like.descr);  // those no view took
  Py_XDECREF(raw);
  return views;
}

PyObject* pyAlignedLike(PyObject*, PyObject* arrays) {
  if (!PyList_CheckExact(arrays) && !PyTuple_CheckExact(arrays)) {
    PyErr_SetString(PyExc_TypeError, "aligned_like(arrays): a list or tuple of numpy arrays");
    return nullptr;
  }
  PyObject* items = PySequence_Tuple(arrays);
  PyObject* views = items != nullptr ? alignedLike(items) : nullptr;
  Py_XDECREF(items);
  return views;
}

// The arguments of grouped_allreduce_aligned, in order.
enum Arg { kArrays, kOp, kName, kPre, kPost, kSet, kWaited, kArgCount };

// Fills ops[i] from arrays[i] (a tuple: Note [Group snapshot]) except its output; false (perhaps
// with an error set, which the caller clears unless it is an interrupt) when the checked path
// must take the group (Note [Aligned group path]).
bool fillGroup(PyObject* const* args, PyObject* arrays, std::vector<runtime::EnqueueArgs>* ops) {
  int reduce_op = 0, set_id = 0;
  const double prescale = PyFloat_AsDouble(args[kPre]);
  if (prescale == -1.0 && PyErr_Occurred()) return false;
  const double postscale = PyFloat_AsDouble(args[kPost]);
  if (postscale == -1.0 && PyErr_Occurred()) return false;
  if (!asCInt(args[kOp], &reduce_op) || !processSetId(args[kSet], &set_id)) return false;
  for (size_t i = 0; i < ops->size(); ++i) {
    PyArrayObject* array =
        plainArray(PyTuple_GET_ITEM(arrays, static_cast<Py_ssize_t>(i)), false);
    int code = 0;
    if (array == nullptr || !dtypeCode(array, &code)) return false;
    runtime::EnqueueArgs& op = (*ops)[i];
    auto& r = op.request;
    const int ndim = PyArray_NDIM(array);
    r.shape.resize(static_cast<size_t>(ndim));
    for (int d = 0; d < ndim; ++d) r.shape[d] = static_cast<int64_t>(PyArray_DIMS(array)[d]);
    op.input = PyArray_DATA(array);
    r.dtype = static_cast<common::DataType>(code);
    setReduction(&r, coord::OpType::kAllreduce, reduce_op, prescale, postscale, set_id);
  }
  return true;
}

// grouped_allreduce_aligned's work on its snapshot `arrays` (a non-empty tuple).
PyObject* submitAligned(PyObject* const* args, PyObject* arrays) {
  std::vector<runtime::EnqueueArgs> ops(static_cast<size_t>(PyTuple_GET_SIZE(arrays)));
  if (!fillGroup(args, arrays, &ops)) {
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;  // Ctrl-C
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  const int waited = PyObject_IsTrue(args[kWaited]);
  if (waited < 0) return nullptr;
  // Carved before named: a failure here (a MemoryError on one rank) must not use up a noname
  // on that rank only, and a declined group uses none either.
  PyObject* outputs = alignedLike(arrays);
  if (outputs == nullptr) return nullptr;
  std::string base;
  if (!fullName("grouped_allreduce", args[kName], args[kSet], &base)) {
    Py_DECREF(outputs);
    return nullptr;
  }
  for (size_t i = 0; i < ops.size(); ++i) {
    ops[i].output = PyArray_DATA(
        reinterpret_cast<PyArrayObject*>(PyList_GET_ITEM(outputs, static_cast<Py_ssize_t>(i))));
  }
  PyObject* handles = submitNamedGroup(std::move(ops), base, 0, waited == 1);
  for (Py_ssize_t i = 0; handles != nullptr && i < PyList_GET_SIZE(handles); ++i) {
    keepRefs(PyLong_AsLongLong(PyList_GET_ITEM(handles, i)), PyTuple_GET_ITEM(arrays, i),
             PyList_GET_ITEM(outputs, i), nullptr, KeptBy::kNumpy);
  }
  Py_DECREF(outputs);
  return handles;
}

// Note [Group snapshot]
// The group's ops hold its arrays' data pointers and shapes, and the kept table keeps those
// arrays alive; between reading them and enqueueing, Python runs (process_set's attributes,
// `waited`'s truth, the noname counter numpy_ops._full_name draws from, a garbage collection
// while carving), and so could another thread that replaces an item of the caller's list. Read
// from that list, the op could then keep the old item's shape while its output is carved for,
// and the keep-alive holds, the new one (a heap overflow, or a use after free). So the call
// takes the group as a tuple once, at entry, and reads every item from it.

// grouped_allreduce_aligned(arrays, op, name, prescale, postscale, process_set, waited) -> core
// handles, each synchronizing to its member's aligned result; or None when the checked path
// must take the call (Note [Aligned group path]).
PyObject* pyGroupedAllreduceAligned(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != kArgCount) {
    PyErr_SetString(PyExc_TypeError, "grouped_allreduce_aligned(arrays, op, name, prescale, "
                    "postscale, process_set, waited)");
    return nullptr;
  }
  if (numpySetup().codes == nullptr) {
    PyErr_SetString(PyExc_RuntimeError,
                    "grouped_allreduce_aligned(): numpy_setup() was not called");
    return nullptr;
  }
  PyObject* given = args[kArrays];
  if (!(PyList_CheckExact(given) || PyTuple_CheckExact(given)) ||
      PySequence_Fast_GET_SIZE(given) == 0 || !runtime::Runtime::instance().initialized()) {
    Py_RETURN_NONE;
  }
  PyObject* arrays = PySequence_Tuple(given);  // Note [Group snapshot]
  if (arrays == nullptr) return nullptr;
  PyObject* handles = submitAligned(args, arrays);
  Py_DECREF(arrays);
  return handles;
}

// synchronize_group(handles) -> every member's result, in order, by the wait loop engine_native
// .torch shares (waitGroup, bindings/group_core.h): a member that fails does not stop the waits
// for the others (each wait frees its member's name and kept arrays); the first failure is
// raised after the last wait. An interrupt (Ctrl-C: a wait that leaves its op pending) stops at
// once and drops the results already taken (unlike torch_group_wait, there are no slots to
// resume with: the caller waits again on the handles it holds; the finished ones are gone).
PyObject* pySynchronizeGroup(PyObject*, PyObject* handles) {
  PyObject* fast = PySequence_Fast(handles, "synchronize_group(handles): a list of handles");
  if (fast == nullptr) return nullptr;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  PyObject* results = PyList_New(n);
  for (Py_ssize_t i = 0; results != nullptr && i < n; ++i) {
    PyList_SET_ITEM(results, i, Py_NewRef(Py_None));  // waitGroup fills the None slots
  }
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  if (results == nullptr) PyErr_Fetch(&type, &value, &traceback);  // still wait: frees names
  const bool waited = waitGroup(fast, results, [](Py_ssize_t, int64_t handle, bool* pending) {
    PyObject* result = synchronizeKept(handle);
    *pending = result == nullptr && runtime::Runtime::instance().handles().poll(handle) >= 0;
    return result;
  });
  Py_DECREF(fast);
  if (results == nullptr) {
    if (waited) {
      PyErr_Restore(type, value, traceback);
    } else {  // the interrupt wins
      Py_XDECREF(type);
      Py_XDECREF(value);
      Py_XDECREF(traceback);
    }
    return nullptr;
  }
  PyObject* failure = waited ? firstFailure(results) : nullptr;  // borrowed from results
  if (failure != nullptr) PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(failure)), failure);
  if (!waited || failure != nullptr) Py_CLEAR(results);
  return results;
}

PyMethodDef g_group_methods[] = {
    {"aligned_like", pyAlignedLike, METH_O,
     "aligned_like(arrays): uninitialised 64-byte aligned views of one new buffer, shaped and "
     "typed as each of `arrays` (numpy arrays), carved in order."},
    {"grouped_allreduce_aligned",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pyGroupedAllreduceAligned)),
     METH_FASTCALL,
     "grouped_allreduce_aligned(arrays, op, name, prescale, postscale, process_set, waited): "
     "enqueue a group of plain arrays into aligned outputs in one call; returns the core "
     "handles (each synchronizes to its output), or None when the checked path must take it."},
    {"synchronize_group", pySynchronizeGroup, METH_O,
     "synchronize_group(handles): every member's result, in order; the first failure is "
     "raised after the last wait."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int addNumpyGroupBindings(PyObject* module) {
  if (PyModule_AddFunctions(module, g_group_methods) < 0) return -1;
  return PyModule_AddIntConstant(module, "ALIGNMENT", kAlignment);
}

}  // namespace hvd::bindings
