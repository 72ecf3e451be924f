// engine_native.jax's host views of an eager group, in C (issue #37): jax_host_views() does what
// arrays.host_views does for the group every training step hands over (a gradient pytree's
// leaves), without its Python loop. Measured 2026-12-05 on benchmarks/bench_jax.py's 20
// gradients, one process, with the caches as a step leaves them (after 3.5 MiB of copies):
// host_views took 73 us, of which np.asarray's buffer protocol was 35 us and the per-array
// checks and their cache the rest (SingleDeviceSharding's __eq__ and __hash__ are Python).
//
// Note [Host views in C]
// jax_host_views takes a group only if arrays.host_views would accept every member and give the
// same view and device: a list or tuple of exact jaxlib ArrayImpl objects, each of a dtype the
// core has (the numpy API's table), placed by an exact SingleDeviceSharding (one device, by
// construction: its `_device`, the device `devices()` would name), whose host view (numpy's
// asarray, the buffer protocol on the CPU) is C-contiguous. Anything else (a numpy input, a
// tracer, another sharding, a dtype not registered yet, a deleted array whose view raises)
// returns None and the checked path decides, raising host_views' errors. Binding code only; runs
// with the GIL held.
#include "bindings/numpy_c_api.h"

#include "bindings/numpy_api.h"
#include "bindings/numpy_fast_path.h"

namespace hvd::bindings {
namespace {

// Set by jax_setup(); references held for the life of the process.
struct JaxSetup {
  PyObject* array_type = nullptr;     // jaxlib's ArrayImpl
  PyObject* sharding_type = nullptr;  // jax.sharding.SingleDeviceSharding
  PyObject* str_dtype = nullptr;
  PyObject* str_sharding = nullptr;
  PyObject* str_device = nullptr;     // "_device"
};
JaxSetup g;

PyObject* pyJaxSetup(PyObject*, PyObject* args) {
  JaxSetup s;
  if (!PyArg_ParseTuple(args, "O!O!", &PyType_Type, &s.array_type, &PyType_Type,
                        &s.sharding_type)) {
    return nullptr;
  }
  Py_INCREF(s.array_type);
  Py_INCREF(s.sharding_type);
  s.str_dtype = PyUnicode_InternFromString("dtype");
  s.str_sharding = PyUnicode_InternFromString("sharding");
  s.str_device = PyUnicode_InternFromString("_device");
  if (s.str_dtype == nullptr || s.str_sharding == nullptr || s.str_device == nullptr) {
    for (PyObject* o : {s.array_type, s.sharding_type, s.str_dtype, s.str_sharding,
                        s.str_device}) {
      Py_XDECREF(o);
    }
    return nullptr;
  }
  g = s;  // a second setup (a reload) leaks the first's few references
  Py_RETURN_NONE;
}

// The host view and device of one member (new references), or false (perhaps with an error set,
// which the caller clears) when the checked path must take the group (Note [Host views in C]).
bool viewOf(PyObject* value, PyObject** host, PyObject** device) {
  if (reinterpret_cast<PyObject*>(Py_TYPE(value)) != g.array_type) return false;
  PyObject* dtype = PyObject_GetAttr(value, g.str_dtype);
  const bool known = dtype != nullptr && PyArray_DescrCheck(dtype) &&
                     PyDict_GetItemWithError(numpySetup().codes, dtype) != nullptr;
  Py_XDECREF(dtype);
  if (!known) return false;
  PyObject* sharding = PyObject_GetAttr(value, g.str_sharding);
  if (sharding == nullptr) return false;
  if (reinterpret_cast<PyObject*>(Py_TYPE(sharding)) == g.sharding_type) {
    *device = PyObject_GetAttr(sharding, g.str_device);
  }
  Py_DECREF(sharding);
  if (*device == nullptr) return false;
  *host = PyArray_FromAny(value, nullptr, 0, 0, 0, nullptr);  // np.asarray(value)
  if (*host != nullptr && PyArray_Check(*host) &&
      PyArray_IS_C_CONTIGUOUS(reinterpret_cast<PyArrayObject*>(*host))) {
    return true;
  }
  Py_CLEAR(*host);
  Py_CLEAR(*device);
  return false;
}

// jax_host_views(values) -> (host views, devices), or None when the checked path must decide.
PyObject* pyJaxHostViews(PyObject*, PyObject* values) {
  if (g.array_type == nullptr || numpySetup().codes == nullptr) {
    PyErr_SetString(PyExc_RuntimeError,
                    "jax_host_views(): jax_setup() and numpy_setup() were not called");
    return nullptr;
  }
  if (!PyList_CheckExact(values) && !PyTuple_CheckExact(values)) Py_RETURN_NONE;
  // viewOf() runs Python (attribute getters, __array__) that could replace or remove the
  // caller's list items while we hold them borrowed: read a tuple taken once instead.
  PyObject* items = PySequence_Tuple(values);
  if (items == nullptr) return nullptr;
  const Py_ssize_t n = PyTuple_GET_SIZE(items);
  PyObject* hosts = PyList_New(n);
  PyObject* devices = PyList_New(n);
  bool ok = hosts != nullptr && devices != nullptr;
  for (Py_ssize_t i = 0; ok && i < n; ++i) {
    PyObject *host = nullptr, *device = nullptr;
    ok = viewOf(PyTuple_GET_ITEM(items, i), &host, &device);
    if (ok) {
      PyList_SET_ITEM(hosts, i, host);  // steal
      PyList_SET_ITEM(devices, i, device);
    }
  }
  Py_DECREF(items);
  if (!ok) {
    Py_XDECREF(hosts);  // unset items are NULL, which list dealloc skips
    Py_XDECREF(devices);
    if (PyErr_Occurred() && !PyErr_ExceptionMatches(PyExc_Exception)) return nullptr;  // Ctrl-C
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  return Py_BuildValue("(NN)", hosts, devices);
}

PyMethodDef g_jax_methods[] = {
    {"jax_setup", pyJaxSetup, METH_VARARGS,
     "jax_setup(array_type, sharding_type): configure jax_host_views (engine_native.jax.arrays "
     "calls it with jaxlib's ArrayImpl and jax.sharding.SingleDeviceSharding)."},
    {"jax_host_views", pyJaxHostViews, METH_O,
     "jax_host_views(values): (host views, devices) of a list of plain single-device jax "
     "arrays, or None when arrays.host_views must decide (Note [Host views in C])."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int addJaxHostBindings(PyObject* module) { return PyModule_AddFunctions(module, g_jax_methods); }

}  // namespace hvd::bindings
