// Hooks on the device reductions (engine_native/csrc/transport/cuda/device_kernels.h): choose
// the NVRTC/driver candidates, launch a reduction on "device" pointers (with the fakes of
// tests/fakecuda they are host memory), compile the kernel source, and the CPU path's result for
// the same inputs (common::reduceInto + scaleInPlace), for tests/native/test_device_kernels.py.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <string>
#include <vector>

#include "common/dtype.h"
#include "testhooks/hooks.h"
#include "transport/cuda/device_kernels.h"
#include "transport/cuda/kernel_compiler.h"
#include "transport/cuda/kernel_libraries.h"

namespace hvd::testhooks {
namespace {

namespace cuda = hvd::transport::cuda;

PyObject* raise(const common::Status& status) {
  PyErr_SetString(status.code() == common::Code::kInvalidArgument ? PyExc_ValueError
                  : status.code() == common::Code::kTypeError     ? PyExc_TypeError
                                                                   : PyExc_RuntimeError,
                  status.message().c_str());
  return nullptr;
}

bool toStrings(PyObject* seq, std::vector<std::string>* out) {
  PyObject* fast = PySequence_Fast(seq, "expected a sequence of str");
  if (fast == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    const char* text = PyUnicode_AsUTF8(PySequence_Fast_GET_ITEM(fast, i));
    if (text == nullptr) {
      Py_DECREF(fast);
      return false;
    }
    out->push_back(text);
  }
  Py_DECREF(fast);
  return true;
}

PyObject* setCandidates(PyObject*, PyObject* args) {
  PyObject* nvrtc = nullptr;
  PyObject* driver = nullptr;
  if (!PyArg_ParseTuple(args, "OO", &nvrtc, &driver)) return nullptr;
  std::vector<std::string> n, d;
  if (!toStrings(nvrtc, &n) || !toStrings(driver, &d)) return nullptr;
  cuda::setDeviceKernelCandidates(std::move(n), std::move(d));
  Py_RETURN_NONE;
}

PyObject* ready(PyObject*, PyObject*) {
  const common::Status status = cuda::deviceKernelsReady();
  if (!status.isOk()) return raise(status);
  Py_RETURN_NONE;
}

// device_reduce(dtype, op, srcs, dst, count, prescale, postscale, stream): launchReduce.
PyObject* deviceReduce(PyObject*, PyObject* args) {
  int dtype = 0, op = 0;
  PyObject* srcs = nullptr;
  unsigned long long dst = 0, count = 0, stream = 0;
  double prescale = 1.0, postscale = 1.0;
  if (!PyArg_ParseTuple(args, "iiOKKddK", &dtype, &op, &srcs, &dst, &count, &prescale,
                        &postscale, &stream)) {
    return nullptr;
  }
  std::vector<const void*> pointers;
  PyObject* fast = PySequence_Fast(srcs, "srcs must be a sequence of addresses");
  if (fast == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    pointers.push_back(PyLong_AsVoidPtr(PySequence_Fast_GET_ITEM(fast, i)));
  }
  Py_DECREF(fast);
  if (PyErr_Occurred()) return nullptr;
  cuda::ReduceJob job;
  job.dtype = static_cast<common::DataType>(dtype);
  job.op = static_cast<common::ReduceOp>(op);
  job.srcs = pointers.data();
  job.nsrcs = static_cast<int>(pointers.size());
  job.dst = reinterpret_cast<void*>(dst);
  job.count = count;
  job.prescale = prescale;
  job.postscale = postscale;
  const common::Status status = cuda::launchReduce(job, reinterpret_cast<void*>(stream));
  if (!status.isOk()) return raise(status);
  Py_RETURN_NONE;
}

// cpu_reduce(dtype, op, [bytes...], prescale, postscale) -> bytes: the CPU executor's order:
// every input scaled by prescale, folded into the first in order, the result postscaled.
PyObject* cpuReduce(PyObject*, PyObject* args) {
  int dtype = 0, op = 0;
  PyObject* inputs = nullptr;
  double prescale = 1.0, postscale = 1.0;
  if (!PyArg_ParseTuple(args, "iiOdd", &dtype, &op, &inputs, &prescale, &postscale)) {
    return nullptr;
  }
  const auto type = static_cast<common::DataType>(dtype);
  const size_t size = common::dataTypeSize(type);
  PyObject* fast = PySequence_Fast(inputs, "inputs must be a sequence of bytes");
  if (fast == nullptr) return nullptr;
  std::string out, scratch;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    char* data = nullptr;
    Py_ssize_t n = 0;
    if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(fast, i), &data, &n) < 0) {
      Py_DECREF(fast);
      return nullptr;
    }
    scratch.assign(data, n);
    common::scaleInPlace(scratch.data(), n / size, type, prescale);
    if (i == 0) {
      out = scratch;
    } else {
      common::reduceInto(out.data(), scratch.data(), n / size, type,
                         static_cast<common::ReduceOp>(op));
    }
  }
  Py_DECREF(fast);
  common::scaleInPlace(out.data(), out.size() / size, type, postscale);
  return PyBytes_FromStringAndSize(out.data(), static_cast<Py_ssize_t>(out.size()));
}

PyObject* imageBytes(const common::Status& status, const std::string& image) {
  if (!status.isOk()) return raise(status);
  return PyBytes_FromStringAndSize(image.data(), static_cast<Py_ssize_t>(image.size()));
}

// compile_reduce_kernels(major, minor, ptx) -> bytes (PTX text or cubin).
PyObject* compileKernels(PyObject*, PyObject* args) {
  int major = 0, minor = 0, ptx = 0;
  if (!PyArg_ParseTuple(args, "iip", &major, &minor, &ptx)) return nullptr;
  std::string image;
  const common::Status status = cuda::compileReduceKernels(major, minor, ptx != 0, &image);
  return imageBytes(status, image);
}

// nvrtc_compile(source, options, ptx) -> bytes, with the already loaded NVRTC.
PyObject* nvrtcCompile(PyObject*, PyObject* args) {
  const char* source = nullptr;
  PyObject* options = nullptr;
  int ptx = 0;
  if (!PyArg_ParseTuple(args, "sOp", &source, &options, &ptx)) return nullptr;
  std::vector<std::string> opts;
  if (!toStrings(options, &opts)) return nullptr;
  if (cuda::nvrtcApi() == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "NVRTC is not loaded: call compile_reduce_kernels first");
    return nullptr;
  }
  std::string image;
  const common::Status status =
      cuda::compileWithNvrtc(*cuda::nvrtcApi(), source, "test.cu", opts, ptx != 0, &image);
  return imageBytes(status, image);
}

PyMethodDef g_functions[] = {
    {"device_kernels_set_candidates", setCandidates, METH_VARARGS,
     "device_kernels_set_candidates(nvrtc, driver): setDeviceKernelCandidates"},
    {"device_kernels_ready", ready, METH_NOARGS, "deviceKernelsReady(); raises its error"},
    {"device_reduce", deviceReduce, METH_VARARGS,
     "device_reduce(dtype, op, srcs, dst, count, prescale, postscale, stream): launchReduce"},
    {"cpu_reduce", cpuReduce, METH_VARARGS,
     "cpu_reduce(dtype, op, inputs, prescale, postscale) -> bytes: the CPU path's result"},
    {"compile_reduce_kernels", compileKernels, METH_VARARGS,
     "compile_reduce_kernels(major, minor, ptx) -> bytes"},
    {"nvrtc_compile", nvrtcCompile, METH_VARARGS,
     "nvrtc_compile(source, options, ptx) -> bytes: one NVRTC compile (errors carry the log)"},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int addDeviceKernelHooks(PyObject* module) { return PyModule_AddFunctions(module, g_functions); }

}  // namespace hvd::testhooks
