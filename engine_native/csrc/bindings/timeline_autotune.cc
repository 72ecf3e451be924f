// Binding code only: converters from the timeline's and the autotuner's C++ types to the
// Python values engine_native._core returns (the running core's functions in
// timeline_autotune_live.cc, metrics() in metrics.cc). Any Python thread, GIL held.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bindings/timeline_autotune.h"

namespace hvd::bindings {

PyObject* recentEventsToList(const std::vector<hvd::timeline::RecentEvent>& events) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(events.size()));
  for (size_t i = 0; list != nullptr && i < events.size(); ++i) {
    const hvd::timeline::RecentEvent& e = events[i];
    PyObject* row = Py_BuildValue("(LsssLs)", static_cast<long long>(e.ts_us), e.name.c_str(),
                                  e.phase.c_str(), e.op.c_str(),
                                  static_cast<long long>(e.duration_us), e.error.c_str());
    if (row == nullptr) {
      Py_DECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, i, row);
  }
  return list;
}

PyObject* tunedParamsToDict(const autotune::TunedParams& p) {
  return Py_BuildValue("{s:L,s:d,s:O,s:O}", "fusion_threshold_bytes",
                       static_cast<long long>(p.fusion_threshold_bytes), "cycle_time_ms",
                       p.cycle_time_ms, "cache_enabled", p.cache_enabled ? Py_True : Py_False,
                       "hierarchical_allreduce", p.hierarchical_allreduce ? Py_True : Py_False);
}

PyObject* autotuneStateToDict(const autotune::AutotuneState& s) {
  PyObject* history = PyList_New(static_cast<Py_ssize_t>(s.history.size()));
  for (size_t i = 0; history != nullptr && i < s.history.size(); ++i) {
    const autotune::AutotuneTrial& t = s.history[i];
    PyObject* row = Py_BuildValue("{s:N,s:d,s:s}", "params", tunedParamsToDict(t.params),
                                  "score", t.score, "phase", autotune::phaseName(t.phase));
    if (row == nullptr) Py_CLEAR(history);
    else PyList_SET_ITEM(history, i, row);
  }
  if (history == nullptr) return nullptr;
  return Py_BuildValue("{s:s,s:i,s:i,s:i,s:N,s:N,s:d,s:N}", "phase",
                       autotune::phaseName(s.phase), "trial", s.trial, "trials", s.trials,
                       "samples", s.samples, "current", tunedParamsToDict(s.current), "best",
                       tunedParamsToDict(s.best), "best_score", s.best_score, "history", history);
}

}  // namespace hvd::bindings
