#include "bindings/group_core.h"

#include <utility>

#include "bindings/core_calls.h"

namespace hvd::bindings {

common::Status enqueueNamedGroup(std::vector<runtime::EnqueueArgs> ops, const std::string& base,
                                 int first, bool waited, std::vector<int64_t>* handles) {
  const size_t n = ops.size();
  std::vector<std::string> names(n, base);  // the ops' names are views: alive until enqueued
  if (first >= 0) {
    const std::string of = "of" + std::to_string(n);
    for (size_t i = 0; i < n; ++i) {
      names[i].append("_").append(std::to_string(first + static_cast<int>(i))).append(of);
    }
  }
  for (size_t i = 0; i < n; ++i) ops[i].name = names[i];
  return runtime::Runtime::instance().enqueue(std::move(ops), handles, /*wake=*/!waited);
}

PyObject* submitNamedGroup(std::vector<runtime::EnqueueArgs> ops, const std::string& base,
                           int first, bool waited) {
  std::vector<int64_t> handles;
  const common::Status status = enqueueNamedGroup(std::move(ops), base, first, waited, &handles);
  if (!status.isOk()) return raiseStatus(status);
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(handles.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < handles.size(); ++i) {
    PyObject* handle = PyLong_FromLongLong(handles[i]);
    if (handle == nullptr) {
      Py_DECREF(list);  // unset items are NULL, which list dealloc skips
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), handle);
  }
  return list;
}

bool waitGroup(PyObject* handles, PyObject* slots, const MemberWait& wait) {
  // Sizes re-read each time: the waits release the GIL, and the lists are the caller's.
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(handles) &&
                         (slots == nullptr || i < PyList_GET_SIZE(slots));
       ++i) {
    if (slots != nullptr && PyList_GET_ITEM(slots, i) != Py_None) continue;  // done before
    PyObject* item = Py_NewRef(PySequence_Fast_GET_ITEM(handles, i));  // __index__ runs Python
    const long long handle = PyLong_AsLongLong(item);
    Py_DECREF(item);
    bool pending = false;
    PyObject* value = handle == -1 && PyErr_Occurred() ? nullptr : wait(i, handle, &pending);
    if (value == nullptr && pending) return false;
    if (value == nullptr && !PyErr_Occurred()) {
      PyErr_SetString(PyExc_SystemError, "a group member failed without an error");
    }
    if (value == nullptr) value = takeError();
    if (value == nullptr) return false;  // never leave a NULL slot
    if (slots == nullptr) {
      Py_DECREF(value);
    } else if (PyList_SetItem(slots, i, value) < 0) {  // steals
      return false;
    }
  }
  return true;
}

PyObject* firstFailure(PyObject* slots) {
  for (Py_ssize_t i = 0; i < PyList_GET_SIZE(slots); ++i) {
    PyObject* slot = PyList_GET_ITEM(slots, i);
    if (PyExceptionInstance_Check(slot)) return slot;
  }
  return nullptr;
}

PyObject* takeError() {
  PyObject *type = nullptr, *value = nullptr, *traceback = nullptr;
  PyErr_Fetch(&type, &value, &traceback);
  PyErr_NormalizeException(&type, &value, &traceback);
  if (traceback != nullptr && value != nullptr) PyException_SetTraceback(value, traceback);
  Py_XDECREF(type);
  Py_XDECREF(traceback);
  return value;
}

}  // namespace hvd::bindings
