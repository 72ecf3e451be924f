// Argument conversion for enqueue(), enqueue_for_wait() and enqueue_group(): Python values to
// runtime::EnqueueArgs. Binding code only; called with the GIL held.
#include "bindings/enqueue_args.h"

#include <climits>
#include <cstdint>

namespace hvd::bindings {

namespace {

template <typename Out>
bool toInt64s(PyObject* seq, Out* out, const char* what) {
  // Any tuple as it is, subclasses included (torch.Size): PySequence_Fast would copy those
  // into a new list.
  PyObject* fast = PyTuple_Check(seq) ? (Py_INCREF(seq), seq) : PySequence_Fast(seq, what);
  if (fast == nullptr) return false;
  Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  out->resize(n);
  for (Py_ssize_t i = 0; i < n; ++i) {
    (*out)[i] = PyLong_AsLongLong(PySequence_Fast_GET_ITEM(fast, i));
    if ((*out)[i] == -1 && PyErr_Occurred()) {
      Py_DECREF(fast);
      return false;
    }
  }
  Py_DECREF(fast);
  return true;
}

}  // namespace

bool toInt64List(PyObject* seq, std::vector<int64_t>* out, const char* what) {
  return toInt64s(seq, out, what);
}

bool toInt64List(PyObject* seq, hvd::coord::Shape* out, const char* what) {
  return toInt64s(seq, out, what);
}

namespace {

const char* kEnqueueKeywords[] = {"kind",      "name",        "dtype",   "shape",
                                  "input_ptr", "output_ptr",  "reduce_op", "prescale",
                                  "postscale", "root",        "process_set", "splits",
                                  "device",    "stream",      nullptr};

// An op's buffer: an integer address (torch's data_ptr()), None (no output), or any object
// with the buffer protocol (a numpy array: cheaper than Python's array.ctypes.data, which
// builds a ctypes object per call). The address is kept, the view released at once: the
// caller keeps the object alive until the op finished (Note [Handle lifetime]).
bool toAddress(PyObject* obj, bool writable, const char* what, uintptr_t* out) {
  if (obj == Py_None) {
    *out = 0;
    return true;
  }
  if (PyLong_Check(obj)) {
    *out = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(obj));
    return !PyErr_Occurred();
  }
  Py_buffer view;
  if (PyObject_GetBuffer(obj, &view, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE) != 0) {
    PyErr_Format(PyExc_TypeError,
                 "enqueue(): %s must be an address or a contiguous%s buffer, got %.80s", what,
                 writable ? " writable" : "", Py_TYPE(obj)->tp_name);
    return false;
  }
  *out = reinterpret_cast<uintptr_t>(view.buf);
  PyBuffer_Release(&view);
  return true;
}

// Fills `op` from the parsed arguments (shared by the positional and keyword parsers).
bool fillOp(int kind, const char* name, Py_ssize_t name_len, int dtype, PyObject* shape,
            PyObject* input_obj, PyObject* output_obj, int reduce_op, double prescale,
            double postscale, int root, int process_set, PyObject* splits, int device,
            PyObject* stream_obj, hvd::runtime::EnqueueArgs* op) {
  uintptr_t input = 0, output = 0, stream = 0;
  if (!toAddress(input_obj, false, "input_ptr", &input) ||
      !toAddress(output_obj, true, "output_ptr", &output)) {
    return false;
  }
  if (stream_obj != nullptr && stream_obj != Py_None) {
    stream = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(stream_obj));
    if (PyErr_Occurred()) return false;
  }
  if (device < -1) {
    PyErr_Format(PyExc_ValueError, "enqueue(): device must be -1 (CPU) or a CUDA ordinal, got %d",
                 device);
    return false;
  }
  if (kind < 0 || kind > 6) {
    PyErr_Format(PyExc_ValueError, "enqueue(): unknown op kind %d", kind);
    return false;
  }
  auto& r = op->request;
  r.type = static_cast<hvd::coord::OpType>(kind);
  op->name = std::string_view(name, static_cast<size_t>(name_len));  // alive during the call
  r.dtype = static_cast<hvd::common::DataType>(dtype);
  r.reduce_op = static_cast<hvd::common::ReduceOp>(reduce_op);
  r.prescale = prescale;
  r.postscale = postscale;
  r.root_rank = root;
  r.process_set = process_set;
  r.device = device;
  if (!toInt64List(shape, &r.shape, "shape must be a sequence of ints")) return false;
  if (splits != nullptr && splits != Py_None &&
      !toInt64List(splits, &r.splits, "splits must be a sequence")) {
    return false;
  }
  op->input = reinterpret_cast<const void*>(static_cast<uintptr_t>(input));
  op->output = reinterpret_cast<void*>(static_cast<uintptr_t>(output));
  op->stream = stream;
  return true;
}

bool parseOp(PyObject* args, PyObject* kwargs, hvd::runtime::EnqueueArgs* op) {
  int kind = 0, dtype = 0, reduce_op = 1, root = 0, process_set = 0, device = -1;
  const char* name = nullptr;
  Py_ssize_t name_len = 0;
  PyObject* shape = nullptr;
  PyObject* splits = Py_None;
  PyObject* input_obj = nullptr;
  PyObject* output_obj = nullptr;
  PyObject* stream = Py_None;
  double prescale = 1.0, postscale = 1.0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "is#iOOO|iddiiOiO",
                                   const_cast<char**>(kEnqueueKeywords), &kind, &name, &name_len,
                                   &dtype, &shape, &input_obj, &output_obj, &reduce_op,
                                   &prescale, &postscale, &root, &process_set, &splits,
                                   &device, &stream)) {
    return false;
  }
  return fillOp(kind, name, name_len, dtype, shape, input_obj, output_obj, reduce_op, prescale,
                postscale, root, process_set, splits, device, stream, op);
}

bool asDouble(PyObject* obj, double* out) {
  double v = PyFloat_AsDouble(obj);
  if (v == -1.0 && PyErr_Occurred()) return false;
  *out = v;
  return true;
}

// enqueue()'s positional form, parsed without building an argument tuple: this runs once per
// tensor per training step. Keywords (or an unusual argument count or type) take parseOp.
}  // namespace

bool asCInt(PyObject* obj, int* out) {
  const long v = PyLong_AsLong(obj);
  if (v == -1 && PyErr_Occurred()) return false;
  if (v < INT_MIN || v > INT_MAX) {  // as PyArg's "i": never a silent wrap (2**32 -> set 0)
    PyErr_SetString(PyExc_OverflowError, "an argument is out of range for a C int");
    return false;
  }
  *out = static_cast<int>(v);
  return true;
}

bool parseEnqueueArgs(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames,
                      hvd::runtime::EnqueueArgs* op) {
  if (kwnames != nullptr || nargs < 6 || nargs > 14 || !PyUnicode_Check(args[1])) {
    PyObject* tuple = PyTuple_New(nargs);
    if (tuple == nullptr) return false;
    for (Py_ssize_t i = 0; i < nargs; ++i) {
      Py_INCREF(args[i]);
      PyTuple_SET_ITEM(tuple, i, args[i]);
    }
    PyObject* kwargs = nullptr;
    if (kwnames != nullptr) {
      kwargs = PyDict_New();
      for (Py_ssize_t i = 0; kwargs != nullptr && i < PyTuple_GET_SIZE(kwnames); ++i) {
        if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) != 0) {
          Py_CLEAR(kwargs);
        }
      }
      if (kwargs == nullptr) {
        Py_DECREF(tuple);
        return false;
      }
    }
    bool ok = parseOp(tuple, kwargs, op);
    Py_DECREF(tuple);
    Py_XDECREF(kwargs);
    return ok;
  }
  int kind = 0, dtype = 0, reduce_op = 1, root = 0, process_set = 0, device = -1;
  double prescale = 1.0, postscale = 1.0;
  Py_ssize_t name_len = 0;
  const char* name = PyUnicode_AsUTF8AndSize(args[1], &name_len);
  if (name == nullptr || !asCInt(args[0], &kind) || !asCInt(args[2], &dtype)) return false;
  if ((nargs > 6 && !asCInt(args[6], &reduce_op)) ||
      (nargs > 7 && !asDouble(args[7], &prescale)) ||
      (nargs > 8 && !asDouble(args[8], &postscale)) || (nargs > 9 && !asCInt(args[9], &root)) ||
      (nargs > 10 && !asCInt(args[10], &process_set)) ||
      (nargs > 12 && !asCInt(args[12], &device))) {
    return false;
  }
  return fillOp(kind, name, name_len, dtype, args[3], args[4], args[5], reduce_op, prescale,
                postscale, root, process_set, nargs > 11 ? args[11] : nullptr, device,
                nargs > 13 ? args[13] : nullptr, op);
}

bool parseEnqueueTuple(PyObject* tuple, hvd::runtime::EnqueueArgs* op) {
  return parseOp(tuple, nullptr, op);
}

}  // namespace hvd::bindings
