// Timeline and autotune bindings for engine_native._core: the running core's functions
// (start_timeline, stop_timeline, timeline_events, autotune_state, set_autotune,
// set_tuned_params in timeline_autotune_live.cc), the pieces metrics() adds, and the
// converters both use (timeline_autotune.cc). Test hooks on a standalone Timeline or
// ParameterManager are not here: they live in tests/native (the _testhooks module).
// Called from PyInit__core and metrics() with the GIL held.
#pragma once

#include <vector>

#include "autotune/parameter_manager.h"
#include "timeline/recent_events.h"

typedef struct _object PyObject;

// Adds the running core's timeline/autotune functions to `module`. Returns 0, or -1 with a
// Python exception set.
int addTimelineAutotuneBindings(PyObject* module);

namespace hvd::bindings {

// metrics() pieces (timeline_autotune_live.cc); new references. The autotune panel in the
// dashboard's schema (None when tuning never ran here) and the collectives finished since the
// previous call.
PyObject* autotuneForMetrics();
PyObject* eventsForMetrics();

// Converters (timeline_autotune.cc); new references, or nullptr with an exception set.
// {"phase", "trial", "trials", "samples", "current", "best", "best_score", "history"}
PyObject* autotuneStateToDict(const autotune::AutotuneState& state);
// {"fusion_threshold_bytes", "cycle_time_ms", "cache_enabled", "hierarchical_allreduce"}
PyObject* tunedParamsToDict(const autotune::TunedParams& params);
// [(ts_us, name, phase, op, duration_us, error), ...]
PyObject* recentEventsToList(const std::vector<timeline::RecentEvent>& events);

}  // namespace hvd::bindings
