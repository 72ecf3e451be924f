// running_threads, cpu_share, cpus_outnumbered, cpu_ranges (testhooks/hooks.h): the pure rules
// behind rank binding, the spin past its budget and yielding spins (runtime/core_headroom.h,
// runtime/cpu_binding.h, common/cpu_ranges.h), on inputs the tests choose: /proc/loadavg texts,
// malformed ones included, CPU topologies this machine does not have (hardware threads
// numbered i and i + N/2, two packages), and ranks' CPU sets of other machines.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <vector>

#include "common/cpu_ranges.h"
#include "runtime/core_headroom.h"
#include "runtime/cpu_binding.h"
#include "testhooks/hooks.h"

namespace hvd::testhooks {
namespace {

// running_threads(text: str) -> int (-1: no count in the text).
PyObject* runningThreads(PyObject*, PyObject* args) {
  const char* text = nullptr;
  if (!PyArg_ParseTuple(args, "s", &text)) return nullptr;
  return PyLong_FromLong(runtime::runningThreads(text));
}

// cpu_share(cpus: list of (cpu, package, core), local_index, local_size) -> list of int.
PyObject* cpuShare(PyObject*, PyObject* args) {
  PyObject* seq = nullptr;
  int index = 0, size = 0;
  if (!PyArg_ParseTuple(args, "Oii", &seq, &index, &size)) return nullptr;
  PyObject* items = PySequence_Tuple(seq);
  if (items == nullptr) return nullptr;
  std::vector<runtime::CpuPlacement> cpus;
  for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(items); ++i) {
    runtime::CpuPlacement p;
    if (!PyArg_ParseTuple(PyTuple_GET_ITEM(items, i), "ill", &p.cpu, &p.package, &p.core)) {
      Py_DECREF(items);
      return nullptr;
    }
    cpus.push_back(p);
  }
  Py_DECREF(items);
  const std::vector<int> share = runtime::cpuShare(cpus, index, size);
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(share.size()));
  if (out == nullptr) return nullptr;
  for (size_t k = 0; k < share.size(); ++k) {
    PyObject* v = PyLong_FromLong(share[k]);
    if (v == nullptr) {
      Py_DECREF(out);
      return nullptr;
    }
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(k), v);
  }
  return out;
}

// cpu_ranges(text: str) -> list of (first, last), or ValueError where the core refuses it.
PyObject* cpuRanges(PyObject*, PyObject* args) {
  const char* text = nullptr;
  Py_ssize_t size = 0;
  if (!PyArg_ParseTuple(args, "s#", &text, &size)) return nullptr;
  common::CpuRanges ranges;
  if (!common::parseCpuRanges(std::string_view(text, static_cast<size_t>(size)), &ranges)) {
    PyErr_SetString(PyExc_ValueError, "refused");
    return nullptr;
  }
  PyObject* out = PyList_New(0);
  for (size_t k = 0; out != nullptr && k < ranges.size(); ++k) {
    PyObject* pair = Py_BuildValue("(ii)", ranges[k].first, ranges[k].last);
    if (pair == nullptr || PyList_Append(out, pair) != 0) Py_CLEAR(out);
    Py_XDECREF(pair);
  }
  return out;
}

// cpus_outnumbered(cpus: list of CPU list texts, fallback_cpus) -> list of bool, one a rank.
PyObject* cpusOutnumbered(PyObject*, PyObject* args) {
  PyObject* seq = nullptr;
  int fallback = 0;
  if (!PyArg_ParseTuple(args, "Oi", &seq, &fallback)) return nullptr;
  PyObject* ranks = PySequence_Tuple(seq);
  if (ranks == nullptr) return nullptr;
  std::vector<common::CpuRanges> cpus(static_cast<size_t>(PyTuple_GET_SIZE(ranks)));
  bool ok = true;
  for (Py_ssize_t r = 0; ok && r < PyTuple_GET_SIZE(ranks); ++r) {
    Py_ssize_t size = 0;
    const char* text = PyUnicode_AsUTF8AndSize(PyTuple_GET_ITEM(ranks, r), &size);
    ok = text != nullptr;
    if (ok && !common::parseCpuRanges(std::string_view(text, static_cast<size_t>(size)),
                                      &cpus[static_cast<size_t>(r)])) {
      PyErr_SetString(PyExc_ValueError, "a CPU list the core refuses");
      ok = false;
    }
  }
  Py_DECREF(ranks);
  if (!ok) return nullptr;
  const std::vector<bool> verdicts = common::cpusOutnumbered(cpus, fallback);
  PyObject* out = PyList_New(static_cast<Py_ssize_t>(verdicts.size()));
  for (size_t k = 0; out != nullptr && k < verdicts.size(); ++k) {
    PyList_SET_ITEM(out, static_cast<Py_ssize_t>(k), PyBool_FromLong(verdicts[k]));
  }
  return out;
}

PyMethodDef kMethods[] = {
    {"running_threads", runningThreads, METH_VARARGS, nullptr},
    {"cpu_share", cpuShare, METH_VARARGS, nullptr},
    {"cpu_ranges", cpuRanges, METH_VARARGS, nullptr},
    {"cpus_outnumbered", cpusOutnumbered, METH_VARARGS, nullptr},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

int addCpuShareHooks(PyObject* module) { return PyModule_AddFunctions(module, kMethods); }

}  // namespace hvd::testhooks
