// Binding code only: converts candidate lists and LoadResults (transport/dynamic_library.h)
// between Python and C++. A failed load is a result ({"error": ...}), not an exception: the caller
// decides whether missing NCCL matters (it does only once a CUDA tensor arrives).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bindings/nccl.h"

#include <string>
#include <vector>

#include "transport/cuda/device_kernels.h"
#include "transport/nccl/loader.h"

namespace {

using hvd::transport::LoadResult;

bool toStrings(PyObject* seq, std::vector<std::string>* out) {
  if (PyUnicode_Check(seq)) {
    PyErr_SetString(PyExc_TypeError, "candidate_paths must be a list of str, not a str");
    return false;
  }
  PyObject* fast = PySequence_Fast(seq, "candidate_paths must be a list of str");
  if (fast == nullptr) return false;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    PyObject* item = PySequence_Fast_GET_ITEM(fast, i);
    PyObject* text = PyOS_FSPath(item);  // str or os.PathLike
    const char* utf8 = text != nullptr && PyUnicode_Check(text) ? PyUnicode_AsUTF8(text)
                                                                 : nullptr;
    if (utf8 == nullptr) {
      if (!PyErr_Occurred() || PyErr_ExceptionMatches(PyExc_TypeError)) {
        PyErr_Clear();
        PyErr_Format(PyExc_TypeError, "candidate_paths[%zd] must be a str path", i);
      }
      Py_XDECREF(text);
      Py_DECREF(fast);
      return false;
    }
    out->push_back(utf8);
    Py_DECREF(text);
  }
  Py_DECREF(fast);
  return true;
}

PyObject* textOrNone(const std::string& text) {
  if (text.empty()) Py_RETURN_NONE;
  return PyUnicode_DecodeFSDefault(text.c_str());
}

// {"path": str | None, "version": int, "version_text": str | None, "error": str | None,
//  "rejected": [(candidate, reason), ...]}
PyObject* resultToDict(const LoadResult& r, std::string (*version_text)(int)) {
  PyObject* rejected = PyList_New(0);
  if (rejected == nullptr) return nullptr;
  for (const auto& item : r.rejected) {
    PyObject* pair = Py_BuildValue("(NN)", PyUnicode_DecodeFSDefault(item.candidate.c_str()),
                                   PyUnicode_FromString(item.reason.c_str()));
    if (pair == nullptr || PyList_Append(rejected, pair) < 0) {
      Py_XDECREF(pair);
      Py_DECREF(rejected);
      return nullptr;
    }
    Py_DECREF(pair);
  }
  return Py_BuildValue("{s:N,s:i,s:N,s:N,s:N}", "path", textOrNone(r.path), "version",
                       r.version, "version_text",
                       textOrNone(r.ok ? version_text(r.version) : std::string()), "error",
                       textOrNone(r.error), "rejected", rejected);
}

PyObject* load(PyObject* arg, LoadResult (*loader)(const std::vector<std::string>&),
               std::string (*version_text)(int)) {
  std::vector<std::string> candidates;
  if (!toStrings(arg, &candidates)) return nullptr;
  LoadResult result;
  Py_BEGIN_ALLOW_THREADS
  result = loader(candidates);
  Py_END_ALLOW_THREADS
  return resultToDict(result, version_text);
}

PyObject* pyNcclLoad(PyObject*, PyObject* arg) {
  return load(arg, &hvd::transport::nccl::loadNccl, &hvd::transport::nccl::ncclVersionText);
}

PyObject* pyCudaRuntimeLoad(PyObject*, PyObject* arg) {
  return load(arg, &hvd::transport::nccl::loadCudaRuntime,
              &hvd::transport::nccl::cudaVersionText);
}

PyObject* pyNcclVersion(PyObject*, PyObject*) {
  return PyLong_FromLong(hvd::transport::nccl::ncclApi() != nullptr
                             ? hvd::transport::nccl::ncclLoadState().version
                             : 0);
}

PyObject* pyNcclState(PyObject*, PyObject*) {
  return resultToDict(hvd::transport::nccl::ncclLoadState(),
                      &hvd::transport::nccl::ncclVersionText);
}

// The libraries the device kernels try (transport/cuda/device_kernels.h), set before the first
// CUDA collective: engine_native.gpu.device_kernel_candidates() computes them.
PyObject* pyDeviceKernelCandidates(PyObject*, PyObject* args) {
  PyObject* nvrtc = nullptr;
  PyObject* driver = nullptr;
  if (!PyArg_ParseTuple(args, "OO", &nvrtc, &driver)) return nullptr;
  std::vector<std::string> nvrtc_paths, driver_paths;
  if (!toStrings(nvrtc, &nvrtc_paths) || !toStrings(driver, &driver_paths)) return nullptr;
  hvd::transport::cuda::setDeviceKernelCandidates(std::move(nvrtc_paths),
                                                 std::move(driver_paths));
  Py_RETURN_NONE;
}

PyMethodDef g_nccl_methods[] = {
    {"device_kernel_candidates", pyDeviceKernelCandidates, METH_VARARGS,
     "device_kernel_candidates(nvrtc_paths, driver_paths): the NVRTC and libcuda candidates "
     "of the device reductions, in order (no effect once loaded)."},
    {"nccl_load", pyNcclLoad, METH_O,
     "nccl_load(candidate_paths) -> dict: load NCCL from the first usable candidate "
     "(path, version, version_text, error, rejected). Loaded once per process."},
    {"nccl_version", pyNcclVersion, METH_NOARGS,
     "NCCL version code of the loaded library (ncclGetVersion), 0 when none is loaded."},
    {"nccl_state", pyNcclState, METH_NOARGS,
     "The last nccl_load result, without trying to load."},
    {"cuda_runtime_load", pyCudaRuntimeLoad, METH_O,
     "cuda_runtime_load(candidate_paths) -> dict: load the CUDA runtime (libcudart) likewise."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int addNcclBindings(PyObject* module) {
  return PyModule_AddFunctions(module, g_nccl_methods);
}
