#include "bindings/numpy_fast_path.h"

#include "bindings/enqueue_args.h"

namespace hvd::bindings {
namespace {
NumpySetup g_setup;
}  // namespace

const NumpySetup& numpySetup() { return g_setup; }
void setNumpySetup(const NumpySetup& setup) { g_setup = setup; }

bool internArgNames(ArgNames* names) {
  constexpr int kMaxNames = static_cast<int>(sizeof(names->interned) / sizeof(PyObject*));
  if (names->count > kMaxNames) {
    PyErr_Format(PyExc_SystemError, "%s: more than %d keyword names", names->function, kMaxNames);
    return false;
  }
  for (int i = 0; i < names->count; ++i) {
    names->interned[i] = PyUnicode_InternFromString(names->names[i]);
    if (names->interned[i] == nullptr) return false;
  }
  return true;
}

namespace {
int argIndex(const ArgNames& names, PyObject* key) {
  for (int i = 0; i < names.count; ++i) {
    if (key == names.interned[i]) return i;
  }
  for (int i = 0; i < names.count; ++i) {
    if (PyUnicode_Compare(key, names.interned[i]) == 0) return i;
  }
  return names.count;
}
}  // namespace

bool parseArgs(ArgNames& names, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
               PyObject** slots) {
  if (nargs > names.max_positional) {
    PyErr_Format(PyExc_TypeError, "%s takes at most %d positional arguments", names.function,
                 names.max_positional);
    return false;
  }
  for (Py_ssize_t i = 0; i < nargs; ++i) slots[i] = args[i];
  const Py_ssize_t nkw = kwnames == nullptr ? 0 : PyTuple_GET_SIZE(kwnames);
  for (Py_ssize_t k = 0; k < nkw; ++k) {
    PyObject* key = PyTuple_GET_ITEM(kwnames, k);
    const int i = argIndex(names, key);
    if (i == names.count || i < nargs) {
      PyErr_Format(PyExc_TypeError, "%s got %s keyword argument '%U'", names.function,
                   i == names.count ? "an unexpected" : "a repeated", key);
      return false;
    }
    slots[i] = args[nargs + k];
  }
  if (slots[0] == nullptr) {
    PyErr_Format(PyExc_TypeError, "%s missing required argument '%s'", names.function,
                 names.names[0]);
    return false;
  }
  return true;
}

PyArrayObject* plainArray(PyObject* obj, bool writable) {
  if (!PyArray_CheckExact(obj)) return nullptr;
  auto* arr = reinterpret_cast<PyArrayObject*>(obj);
  const int need = NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | (writable ? NPY_ARRAY_WRITEABLE : 0);
  if (!PyArray_CHKFLAGS(arr, need) || !PyArray_ISNOTSWAPPED(arr)) return nullptr;
  return arr;
}

bool dtypeCode(PyArrayObject* array, int* code) {
  PyObject* code_obj = PyDict_GetItemWithError(
      g_setup.codes, reinterpret_cast<PyObject*>(PyArray_DESCR(array)));  // borrowed
  if (code_obj == nullptr) return false;
  *code = static_cast<int>(PyLong_AsLong(code_obj));
  return true;
}

bool processSetId(PyObject* process_set, int* id) {
  *id = 0;
  if (process_set == nullptr || process_set == Py_None || process_set == g_setup.global_set) {
    return true;
  }
  PyObject* id_obj = PyObject_GetAttr(process_set, g_setup.str_set_id);
  if (id_obj == nullptr) return false;
  const bool ok = id_obj != Py_None && asCInt(id_obj, id);
  Py_DECREF(id_obj);
  return ok && *id >= 0;  // unregistered (None) or not an int: the checked path says so
}

bool fullName(const char* kind, PyObject* name, PyObject* process_set, std::string* full) {
  const int named = PyObject_IsTrue(name);
  if (named < 0) return false;
  Py_ssize_t len = 0;
  if (named == 1) {
    PyObject* text_obj = PyObject_Str(name);  // the same object for a str
    const char* text = text_obj != nullptr ? PyUnicode_AsUTF8AndSize(text_obj, &len) : nullptr;
    if (text != nullptr) {
      full->assign(kind);
      full->push_back('.');
      full->append(text, static_cast<size_t>(len));
    }
    Py_XDECREF(text_obj);
    return text != nullptr;
  }
  PyObject* call[] = {PyUnicode_FromString(kind), Py_None,
                      process_set != nullptr ? process_set : Py_None};
  PyObject* full_obj =
      call[0] != nullptr ? PyObject_Vectorcall(g_setup.noname, call, 3, nullptr) : nullptr;
  Py_XDECREF(call[0]);
  const char* text = full_obj != nullptr ? PyUnicode_AsUTF8AndSize(full_obj, &len) : nullptr;
  if (text != nullptr) full->assign(text, static_cast<size_t>(len));
  Py_XDECREF(full_obj);
  return text != nullptr;
}

}  // namespace hvd::bindings
