// PyInit__testhooks: the test-only extension (testhooks/hooks.h).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "testhooks/hooks.h"

namespace hvd::testhooks {

bool toDoubles(PyObject* seq, std::vector<double>* out, const char* what) {
  PyObject* fast = PySequence_Fast(seq, what);
  if (fast == nullptr) return false;
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out->resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    (*out)[i] = PyFloat_AsDouble(PySequence_Fast_GET_ITEM(fast, i));
    if ((*out)[i] == -1.0 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
  }
  Py_DECREF(fast);
  return true;
}

}  // namespace hvd::testhooks

namespace {

PyModuleDef g_module = {PyModuleDef_HEAD_INIT, "_testhooks",
                        "Test hooks on the core's timeline and autotuner (tests/native).", -1,
                        nullptr, nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__testhooks() {
  PyObject* module = PyModule_Create(&g_module);
  if (module == nullptr) return nullptr;
  if (hvd::testhooks::addTimelineWriter(module) < 0 ||
      hvd::testhooks::addAutotuneHooks(module) < 0 ||
      hvd::testhooks::addDeviceKernelHooks(module) < 0 ||
      hvd::testhooks::addPeerBlockHooks(module) < 0 ||
      hvd::testhooks::addHmacHooks(module) < 0 ||
      hvd::testhooks::addByteCodecHooks(module) < 0 ||
      hvd::testhooks::addCpuShareHooks(module) < 0) {
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
