// Binding code only: the running core's timeline and autotune — start_timeline, stop_timeline,
// timeline_events, autotune_state, set_autotune — and the pieces metrics() adds for the
// dashboard (autotune panel, recent collectives). Contract in engine_native/_core.pyi.
// Any Python thread; the GIL is released around calls that wait for the timeline writer.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <chrono>
#include <mutex>
#include <string>

#include "bindings/timeline_autotune.h"
#include "runtime/runtime.h"

namespace {

using hvd::common::Status;
using hvd::runtime::Runtime;

PyObject* raiseStatus(const Status& status) {
  PyObject* type = status.code() == hvd::common::Code::kInvalidArgument ? PyExc_ValueError
                                                                          : PyExc_RuntimeError;
  PyErr_SetString(type, status.message().c_str());
  return nullptr;
}

int64_t epochMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void setItem(PyObject* dict, const char* key, PyObject* value) {
  if (value == nullptr) return;
  PyDict_SetItemString(dict, key, value);
  Py_DECREF(value);
}

PyObject* switchesToList(const std::vector<hvd::runtime::AppliedParams>& switches) {
  PyObject* list = PyList_New(0);
  for (const auto& s : switches) {
    PyObject* row = Py_BuildValue("{s:K,s:N,s:s}", "responses_before",
                                  static_cast<unsigned long long>(s.responses_before), "params",
                                  hvd::bindings::tunedParamsToDict(s.params), "phase",
                                  s.phase.c_str());
    if (row != nullptr) {
      PyList_Append(list, row);
      Py_DECREF(row);
    }
  }
  return list;
}

// ---- module functions ----------------------------------------------------------------------

PyObject* pyStartTimeline(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"file_path", "mark_cycles", nullptr};
  const char* path = nullptr;
  int mark = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|p", const_cast<char**>(kw), &path, &mark)) {
    return nullptr;
  }
  Status status;
  std::string file(path);
  Py_BEGIN_ALLOW_THREADS
  status = Runtime::instance().startTimeline(file, mark != 0);
  Py_END_ALLOW_THREADS
  if (!status.isOk()) return raiseStatus(status);
  Py_RETURN_NONE;
}

PyObject* pyStopTimeline(PyObject*, PyObject*) {
  Status status;
  Py_BEGIN_ALLOW_THREADS
  status = Runtime::instance().stopTimeline();
  Py_END_ALLOW_THREADS
  if (!status.isOk()) return raiseStatus(status);
  Py_RETURN_NONE;
}

PyObject* pyTimelineEvents(PyObject*, PyObject* args) {
  long long since = 0;
  if (!PyArg_ParseTuple(args, "|L", &since)) return nullptr;
  return hvd::bindings::recentEventsToList(Runtime::instance().timelineEvents(since));
}

PyObject* pyAutotuneState(PyObject*, PyObject*) {
  auto report = Runtime::instance().autotuneReport();
  if (!report) {
    return Py_BuildValue("{s:O,s:O,s:s,s:s}", "enabled", Py_False, "tuner", Py_False, "phase",
                         "off", "applied_phase", "off");
  }
  PyObject* dict = nullptr;
  if (report->state) {
    dict = hvd::bindings::autotuneStateToDict(*report->state);
  } else {
    dict = Py_BuildValue("{s:i,s:N,s:O,s:O,s:N}", "samples", 0, "current",
                         hvd::bindings::tunedParamsToDict(report->applied), "best", Py_None,
                         "best_score", Py_None, "history", PyList_New(0));
  }
  if (dict == nullptr) return nullptr;
  setItem(dict, "enabled", PyBool_FromLong(report->enabled));
  setItem(dict, "tuner", PyBool_FromLong(report->tuner));
  setItem(dict, "phase", PyUnicode_FromString(report->phase.c_str()));
  setItem(dict, "trial", PyLong_FromLong(report->trial));
  setItem(dict, "trials", PyLong_FromLong(report->trials));
  setItem(dict, "planned_settings", PyLong_FromLong(report->planned_settings));
  setItem(dict, "applied", hvd::bindings::tunedParamsToDict(report->applied));
  setItem(dict, "applied_phase", PyUnicode_FromString(report->applied_phase.c_str()));
  setItem(dict, "switches", switchesToList(report->switches));
  return dict;
}

PyObject* pySetAutotune(PyObject*, PyObject* arg) {
  const int on = PyObject_IsTrue(arg);
  if (on < 0) return nullptr;
  Status status = Runtime::instance().setAutotune(on != 0);
  if (!status.isOk()) return raiseStatus(status);
  Py_RETURN_NONE;
}

PyObject* pySetTunedParams(PyObject*, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"fusion_threshold_bytes", "cycle_time_ms", "cache_enabled",
                             "hierarchical_allreduce", nullptr};
  long long fusion = 0;
  double cycle = 0.0;
  int cache = 1, hierarchical = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "Ld|pp", const_cast<char**>(kw), &fusion,
                                   &cycle, &cache, &hierarchical)) {
    return nullptr;
  }
  hvd::autotune::TunedParams p;
  p.fusion_threshold_bytes = fusion;
  p.cycle_time_ms = cycle;
  p.cache_enabled = cache != 0;
  p.hierarchical_allreduce = hierarchical != 0;
  Status status = Runtime::instance().setTunedParams(p);
  if (!status.isOk()) return raiseStatus(status);
  Py_RETURN_NONE;
}

PyMethodDef g_live_functions[] = {
    {"start_timeline", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pyStartTimeline)),
     METH_VARARGS | METH_KEYWORDS,
     "start_timeline(file_path, mark_cycles=False): rank 0 writes a Chrome trace."},
    {"stop_timeline", pyStopTimeline, METH_NOARGS, "stop_timeline(): close the file, valid."},
    {"timeline_events", pyTimelineEvents, METH_VARARGS,
     "timeline_events(since_us=0) -> [(ts_us, name, phase, op, duration_us, error), ...]"},
    {"autotune_state", pyAutotuneState, METH_NOARGS, "autotune_state() -> dict"},
    {"set_autotune", pySetAutotune, METH_O, "set_autotune(enabled): start/stop tuning."},
    {"set_tuned_params",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pySetTunedParams)),
     METH_VARARGS | METH_KEYWORDS,
     "set_tuned_params(fusion_threshold_bytes, cycle_time_ms, cache_enabled=True, "
     "hierarchical_allreduce=False): rank 0 stops tuning, every rank switches with the next "
     "batch."},
    {nullptr, nullptr, 0, nullptr}};

std::mutex g_events_mutex;
int64_t g_events_cursor_us = 0;  // end time of the newest event metrics() has returned

}  // namespace

int addTimelineAutotuneBindings(PyObject* module) {
  return PyModule_AddFunctions(module, g_live_functions);
}

namespace hvd::bindings {

// metrics()["autotune"] in the dashboard's schema (widgets/snapshot.py), or None when tuning
// never ran on this rank: sample k of n settings, scores per setting (rank 0 only).
PyObject* autotuneForMetrics() {
  auto report = runtime::Runtime::instance().autotuneReport();
  if (!report || (!report->enabled && !report->state && report->switches.empty())) {
    Py_RETURN_NONE;
  }
  PyObject* scores = PyList_New(0);
  PyObject* best = PyDict_New();
  double best_score = 0.0;
  int scored = 0;
  bool measuring = false;
  if (report->state) {
    const auto& s = *report->state;
    for (size_t i = 0; i < s.history.size(); ++i) {
      PyObject* row = Py_BuildValue("[nd]", static_cast<Py_ssize_t>(i + 1), s.history[i].score);
      PyList_Append(scores, row);
      Py_XDECREF(row);
    }
    scored = static_cast<int>(s.history.size());
    measuring = report->enabled && s.phase != autotune::AutotunePhase::kDone &&
                s.phase != autotune::AutotunePhase::kWarmup;
    Py_DECREF(best);
    best = tunedParamsToDict(s.best);
    best_score = s.best_score;
  }
  const int planned = std::max(report->planned_settings, scored);
  return Py_BuildValue("{s:O,s:s,s:i,s:i,s:N,s:N,s:d,s:N}", "enabled",
                       report->enabled ? Py_True : Py_False, "phase", report->phase.c_str(),
                       "sample", std::min(scored + (measuring ? 1 : 0), planned), "samples",
                       planned, "current", tunedParamsToDict(report->applied), "best", best,
                       "best_score", best_score, "scores", scores);
}

// metrics()["events"]: collectives (op spans and ERROR ticks) that finished since the previous
// metrics() call in this process, as {"op", "name", "start_ago_s", "dur_s", "error"}.
PyObject* eventsForMetrics() {
  const auto events = runtime::Runtime::instance().timelineEvents(0);
  const int64_t now = epochMicros();
  std::lock_guard<std::mutex> lock(g_events_mutex);
  PyObject* list = PyList_New(0);
  int64_t newest = g_events_cursor_us;
  for (const auto& e : events) {
    const int64_t end = e.ts_us + e.duration_us;
    if (e.phase != "op" || end <= g_events_cursor_us) continue;
    newest = std::max(newest, end);
    PyObject* item = Py_BuildValue("{s:s,s:s,s:d,s:d,s:s}", "op", e.op.c_str(), "name",
                                   e.name.c_str(), "start_ago_s", (now - e.ts_us) / 1e6, "dur_s",
                                   e.duration_us / 1e6, "error", e.error.c_str());
    if (item != nullptr) {
      PyList_Append(list, item);
      Py_DECREF(item);
    }
  }
  g_events_cursor_us = newest;
  return list;
}

}  // namespace hvd::bindings
