// engine_native.torch's allreduce, per tensor, in C: the tensor checks, the enqueue and the kept
// references, and synchronize. A gradient hook of the DistributedOptimizer costs this once per
// parameter per step; in Python (check_tensor, the op tuple, the handle record, synchronize's
// loop) it cost ~4 µs per tensor, about four times the numpy path.
//
// Tensors are read through their Python attributes, never libtorch's C++ API: the extension
// must load unchanged under any PyTorch version (DESIGN: no rebuild on a PyTorch upgrade).
// Only exact torch.Tensor and torch.nn.Parameter objects are taken (a subclass may override
// any attribute through __torch_function__); anything else — another type, a device other
// than the CPU, a layout other than strided, non-contiguous memory, a dtype the core lacks,
// scale factors that are not numbers, an uninitialised core — is declined with None before
// anything is enqueued or named, and engine_native.torch's checked Python path decides and
// raises Horovod's errors. Binding code only; every function runs with the GIL held.
#include "bindings/torch_api.h"

#include <cstdint>
#include <string>

#include "bindings/core_calls.h"
#include "bindings/enqueue_args.h"
#include "bindings/kept_table.h"
#include "runtime/runtime.h"

namespace hvd::bindings {
namespace {

using runtime::Runtime;

// Set by torch_setup(); references held for the life of the process.
struct TorchSetup {
  PyObject* tensor_type = nullptr;     // torch.Tensor
  PyObject* parameter_type = nullptr;  // torch.nn.Parameter
  PyObject* strided = nullptr;         // torch.strided
  PyObject* codes = nullptr;           // {torch dtype: core dtype code}
  PyObject* op_name = nullptr;         // runtime.op_name(prefix, name, set_id): noname counters
  PyObject* str_is_cpu = nullptr;
  PyObject* str_layout = nullptr;
  PyObject* str_dtype = nullptr;
  PyObject* str_shape = nullptr;
  PyObject* str_is_contiguous = nullptr;
  PyObject* str_data_ptr = nullptr;
  PyObject* str_allreduce = nullptr;
};
TorchSetup g;

PyObject* pyTorchSetup(PyObject*, PyObject* args) {
  TorchSetup s;
  if (!PyArg_ParseTuple(args, "O!O!OO!O", &PyType_Type, &s.tensor_type, &PyType_Type,
                        &s.parameter_type, &s.strided, &PyDict_Type, &s.codes, &s.op_name)) {
    return nullptr;
  }
  for (PyObject* o : {s.tensor_type, s.parameter_type, s.strided, s.codes, s.op_name}) {
    Py_INCREF(o);
  }
  PyObject** names[] = {&s.str_is_cpu, &s.str_layout,       &s.str_dtype,    &s.str_shape,
                        &s.str_is_contiguous, &s.str_data_ptr, &s.str_allreduce};
  const char* texts[] = {"is_cpu", "layout", "dtype", "shape", "is_contiguous", "data_ptr",
                         "allreduce"};
  for (size_t i = 0; i < sizeof(texts) / sizeof(texts[0]); ++i) {
    *names[i] = PyUnicode_InternFromString(texts[i]);
    if (*names[i] == nullptr) return nullptr;
  }
  g = s;
  Py_RETURN_NONE;
}

// attribute == expected (by identity), for attributes torch returns as singletons.
bool attrIs(PyObject* obj, PyObject* name, PyObject* expected) {
  PyObject* value = PyObject_GetAttr(obj, name);
  if (value == nullptr) return false;
  const bool same = value == expected;
  Py_DECREF(value);
  return same;
}

// obj.method() == True
bool callIsTrue(PyObject* obj, PyObject* method) {
  PyObject* value = PyObject_CallMethodNoArgs(obj, method);
  if (value == nullptr) return false;
  const bool yes = value == Py_True;
  Py_DECREF(value);
  return yes;
}

// obj.data_ptr()
bool dataPtr(PyObject* obj, uintptr_t* address) {
  PyObject* value = PyObject_CallMethodNoArgs(obj, g.str_data_ptr);
  if (value == nullptr) return false;
  *address = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(value));
  Py_DECREF(value);
  return !PyErr_Occurred();
}

// True if the core can use `tensor`'s memory as it is: an exact torch.Tensor or Parameter, on
// the CPU, strided and contiguous. False (perhaps with an error set, which the caller clears)
// otherwise.
bool plainTensor(PyObject* tensor) {
  PyObject* type = reinterpret_cast<PyObject*>(Py_TYPE(tensor));
  return (type == g.tensor_type || type == g.parameter_type) &&
         attrIs(tensor, g.str_is_cpu, Py_True) && attrIs(tensor, g.str_layout, g.strided) &&
         callIsTrue(tensor, g.str_is_contiguous);
}

// Fills `op` from an input tensor and its output (the same object in place); false (perhaps
// with an error set) when the checked path must decide. `dtype_out`, when given, receives a
// new reference to the tensor's dtype on success.
bool fillTensorOp(PyObject* tensor, PyObject* output, runtime::EnqueueArgs* op,
                  PyObject** dtype_out = nullptr) {
  if (!plainTensor(tensor) || (output != tensor && !plainTensor(output))) return false;
  PyObject* dtype = PyObject_GetAttr(tensor, g.str_dtype);
  if (dtype == nullptr) return false;
  PyObject* code_obj = PyDict_GetItemWithError(g.codes, dtype);  // borrowed
  bool same_dtype = true;
  if (output != tensor) same_dtype = attrIs(output, g.str_dtype, dtype);
  int code = 0;
  if (code_obj == nullptr || !same_dtype || !asCInt(code_obj, &code)) {
    Py_DECREF(dtype);
    return false;
  }
  PyObject* shape = PyObject_GetAttr(tensor, g.str_shape);  // torch.Size, a tuple
  if (shape == nullptr) {
    Py_DECREF(dtype);
    return false;
  }
  const bool ok = toInt64List(shape, &op->request.shape, "shape");
  Py_DECREF(shape);
  uintptr_t input_address = 0, output_address = 0;
  if (!ok || !dataPtr(tensor, &input_address) ||
      (output != tensor && !dataPtr(output, &output_address))) {
    Py_DECREF(dtype);
    return false;
  }
  if (output == tensor) output_address = input_address;
  op->input = reinterpret_cast<const void*>(input_address);
  op->output = reinterpret_cast<void*>(output_address);
  op->request.dtype = static_cast<common::DataType>(code);
  if (dtype_out != nullptr) {
    *dtype_out = dtype;
  } else {
    Py_DECREF(dtype);
  }
  return true;
}

// torch_allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, set_id,
// waited) -> core handle, or None when the checked Python path must take the call. `op` and
// `set_id` were validated by the caller; the name becomes "allreduce.<name>", or the next
// "allreduce.noname.<n>" only once the op is certain to be submitted.
PyObject* pyTorchAllreduceAsync(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 8) {
    PyErr_SetString(PyExc_TypeError,
                    "torch_allreduce_async(tensor, output, name, op, prescale_factor, "
                    "postscale_factor, set_id, waited)");
    return nullptr;
  }
  if (g.tensor_type == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "torch_allreduce_async(): torch_setup() was not called");
    return nullptr;
  }
  PyObject* tensor = args[0];
  PyObject* output = args[1];
  PyObject* name = args[2];
  runtime::EnqueueArgs op;
  auto& r = op.request;
  int reduce_op = 0, set_id = 0;
  const bool named = name != Py_None && !(PyUnicode_Check(name) && PyUnicode_GET_LENGTH(name) == 0);
  const bool usable = Runtime::instance().initialized() && (!named || PyUnicode_CheckExact(name)) &&
                      asCInt(args[3], &reduce_op) && asCInt(args[6], &set_id) &&
                      !((r.prescale = PyFloat_AsDouble(args[4])) == -1.0 && PyErr_Occurred()) &&
                      !((r.postscale = PyFloat_AsDouble(args[5])) == -1.0 && PyErr_Occurred()) &&
                      fillTensorOp(tensor, output, &op);
  const int waited = usable ? PyObject_IsTrue(args[7]) : 0;
  if (!usable || waited < 0) {
    PyErr_Clear();
    Py_RETURN_NONE;
  }
  // Horovod's tensor name: "allreduce.<name>", or "allreduce.noname.<n>" from the counter.
  std::string full;
  if (named) {
    Py_ssize_t length = 0;
    const char* text = PyUnicode_AsUTF8AndSize(name, &length);
    if (text == nullptr) return nullptr;
    full.reserve(10 + static_cast<size_t>(length));
    full.append("allreduce.").append(text, static_cast<size_t>(length));
  } else {
    // The counter of the op's set (Note [Noname counters] in torch/runtime.py).
    PyObject* set_obj = PyLong_FromLong(set_id);
    PyObject* call[] = {g.str_allreduce, Py_None, set_obj};
    PyObject* full_obj = set_obj != nullptr ? PyObject_Vectorcall(g.op_name, call, 3, nullptr)
                                            : nullptr;
    Py_XDECREF(set_obj);
    Py_ssize_t length = 0;
    const char* text = full_obj != nullptr ? PyUnicode_AsUTF8AndSize(full_obj, &length) : nullptr;
    if (text != nullptr) full.assign(text, static_cast<size_t>(length));
    Py_XDECREF(full_obj);
    if (text == nullptr) return nullptr;
  }
  op.name = full;
  r.type = coord::OpType::kAllreduce;
  r.reduce_op = static_cast<common::ReduceOp>(reduce_op);
  r.process_set = set_id;
  int64_t handle = 0;
  common::Status status = Runtime::instance().enqueue(std::move(op), &handle, !waited);
  if (!status.isOk()) return raiseStatus(status);
  // output is tensor in place: kept twice, harmless
  keepRefs(handle, tensor, output, nullptr, KeptBy::kTorch);
  return PyLong_FromLongLong(handle);
}

// torch_synchronize(handle): the kept output once the op finished (raises its error), or None
// for a handle this path does not hold (unknown, or already synchronized).
PyObject* pyTorchSynchronize(PyObject*, PyObject* arg) {
  const long long handle = PyLong_AsLongLong(arg);
  if (handle == -1 && PyErr_Occurred()) return nullptr;
  if (!isKept(handle)) Py_RETURN_NONE;
  return synchronizeKept(handle);
}

// torch_release_kept(): forget every handle of this path (engine_native.torch's shutdown()
// and init(); the core has finished or failed every op by then).
PyObject* pyTorchReleaseKept(PyObject*, PyObject*) {
  releaseKept(KeptBy::kTorch);
  Py_RETURN_NONE;
}

// torch_kept(handle): True while this path holds `handle` (enqueued, not yet synchronized).
PyObject* pyTorchKept(PyObject*, PyObject* arg) {
  const long long handle = PyLong_AsLongLong(arg);
  if (handle == -1 && PyErr_Occurred()) return nullptr;
  return PyBool_FromLong(isKept(handle));
}

PyMethodDef g_torch_methods[] = {
    {"torch_setup", pyTorchSetup, METH_VARARGS,
     "torch_setup(Tensor, Parameter, strided, codes, op_name): configure the torch fast path "
     "(engine_native.torch.runtime calls it)."},
    {"torch_allreduce_async",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pyTorchAllreduceAsync)),
     METH_FASTCALL,
     "torch_allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor, "
     "set_id, waited): enqueue an allreduce of a plain CPU tensor into `output`; returns the "
     "handle, or None when the checked path must take the call."},
    {"torch_synchronize", pyTorchSynchronize, METH_O,
     "torch_synchronize(handle): wait and return the output, None for a handle not held here."},
    {"torch_release_kept", pyTorchReleaseKept, METH_NOARGS,
     "torch_release_kept(): drop every tensor torch_allreduce_async kept (shutdown, init)."},
    {"torch_kept", pyTorchKept, METH_O,
     "torch_kept(handle): True while torch_allreduce_async's handle is not synchronized."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int addTorchBindings(PyObject* module) { return PyModule_AddFunctions(module, g_torch_methods); }

bool torchSetUp() { return g.tensor_type != nullptr; }

bool fillTorchOp(PyObject* tensor, PyObject* output, runtime::EnqueueArgs* op,
                 PyObject** dtype) {
  return fillTensorOp(tensor, output, op, dtype);
}

PyObject* torchOpName(PyObject* prefix, PyObject* name, int set_id) {
  PyObject* set_obj = PyLong_FromLong(set_id);
  if (set_obj == nullptr) return nullptr;
  PyObject* call[] = {prefix, name, set_obj};
  PyObject* full = PyObject_Vectorcall(g.op_name, call, 3, nullptr);
  Py_DECREF(set_obj);
  return full;
}

}  // namespace hvd::bindings
