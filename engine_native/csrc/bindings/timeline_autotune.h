// Timeline and autotune bindings for engine_native._core: test hooks (TimelineWriterForTest in
// timeline_autotune.cc; ParameterManagerForTest, autotune_maximize, gp_fit_predict in
// timeline_autotune_math.cc), the running core's functions (start_timeline, stop_timeline,
// timeline_events, autotune_state, set_autotune in timeline_autotune_live.cc) and converters
// the runtime's binding reuses for metrics.
// Called from PyInit__core on the importing thread; every function here needs the GIL.
#pragma once

#include <cstdint>
#include <vector>

#include "autotune/parameter_manager.h"
#include "timeline/recent_events.h"

typedef struct _object PyObject;

// Adds all the hooks to `module`. Returns 0, or -1 with a Python exception set.
int addTimelineAutotuneBindings(PyObject* module);

namespace hvd::bindings {

// The autotune half of addTimelineAutotuneBindings (timeline_autotune_math.cc).
int addAutotuneBindings(PyObject* module);
// The running core's timeline/autotune functions (timeline_autotune_live.cc); called by
// addTimelineAutotuneBindings.
int addLiveTimelineAutotuneBindings(PyObject* module);
// metrics() pieces (timeline_autotune_live.cc); new references. The autotune panel in the
// dashboard's schema (None when tuning never ran here) and the collectives finished since the
// previous call.
PyObject* autotuneForMetrics();
PyObject* eventsForMetrics();
// Sequence of numbers -> doubles; false with a Python exception naming `what` otherwise.
bool toDoubles(PyObject* seq, std::vector<double>* out, const char* what);

// Converters for metrics; new references, or nullptr with an exception set. GIL held.
// {"phase", "trial", "trials", "samples", "current", "best", "best_score", "history"}
PyObject* autotuneStateToDict(const autotune::AutotuneState& state);
// {"fusion_threshold_bytes", "cycle_time_ms", "cache_enabled", "hierarchical_allreduce"}
PyObject* tunedParamsToDict(const autotune::TunedParams& params);
// [(ts_us, name, phase, op, duration_us, error), ...]
PyObject* recentEventsToList(const std::vector<timeline::RecentEvent>& events);

}  // namespace hvd::bindings
