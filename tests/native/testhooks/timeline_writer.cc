// Test hook, never in the product: TimelineWriterForTest, a Python handle on a real Timeline,
// so unit tests drive the same recorder, ring and writer thread the background loop uses
// (tests/unit/test_timeline_writer.py, benchmarks/bench_timeline.py). Built into _testhooks
// by tests/native/build.py; the module's thread (the GIL holder) calls it.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "bindings/timeline_autotune.h"
#include "common/dtype.h"
#include "testhooks/hooks.h"
#include "timeline/timeline.h"

namespace {

using hvd::bindings::recentEventsToList;
using hvd::testhooks::toDoubles;
using hvd::timeline::Timeline;

// ---- TimelineWriterForTest ----------------------------------------------------------------

struct TimelineObject {
  PyObject_HEAD
  Timeline* timeline;
};

Timeline& timelineOf(PyObject* self) { return *reinterpret_cast<TimelineObject*>(self)->timeline; }

PyObject* timelineNew(PyTypeObject* type, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"ring_slots", "live_window_seconds", "live_max_events",
                             "flush_interval_ms", nullptr};
  hvd::timeline::TimelineOptions o;
  Py_ssize_t slots = static_cast<Py_ssize_t>(o.ring_slots);
  Py_ssize_t max_events = static_cast<Py_ssize_t>(o.live_max_events);
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|ndni", const_cast<char**>(kw), &slots,
                                   &o.live_window_seconds, &max_events, &o.flush_interval_ms)) {
    return nullptr;
  }
  o.ring_slots = static_cast<size_t>(std::max<Py_ssize_t>(2, slots));
  o.live_max_events = static_cast<size_t>(std::max<Py_ssize_t>(1, max_events));
  auto* self = reinterpret_cast<TimelineObject*>(type->tp_alloc(type, 0));
  if (self != nullptr) self->timeline = new Timeline(o);
  return reinterpret_cast<PyObject*>(self);
}

void timelineDealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  delete reinterpret_cast<TimelineObject*>(self)->timeline;
  type->tp_free(self);
  Py_DECREF(type);
}

PyObject* timelineStart(PyObject* self, PyObject* args, PyObject* kwargs) {
  static const char* kw[] = {"path", "mark_cycles", nullptr};
  const char* path = nullptr;
  int mark = 0;
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "s|p", const_cast<char**>(kw), &path, &mark)) {
    return nullptr;
  }
  hvd::common::Status status;
  Py_BEGIN_ALLOW_THREADS
  status = timelineOf(self).start(path, mark != 0);
  Py_END_ALLOW_THREADS
  if (!status.isOk()) return PyErr_Format(PyExc_ValueError, "%s", status.message().c_str());
  Py_RETURN_NONE;
}

PyObject* timelineStop(PyObject* self, PyObject*) {
  Py_BEGIN_ALLOW_THREADS
  timelineOf(self).stop();
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* timelineLive(PyObject* self, PyObject* arg) {
  const int on = PyObject_IsTrue(arg);
  if (on < 0) return nullptr;
  Py_BEGIN_ALLOW_THREADS
  timelineOf(self).setLiveCapture(on != 0);
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

// The recording calls: thin wrappers over Timeline's, one per method.
using NameText = void (Timeline::*)(std::string_view, std::string_view);
using NameOnly = void (Timeline::*)(std::string_view);

PyObject* recordNameText(PyObject* self, PyObject* args, NameText call) {
  const char* name = nullptr;
  const char* text = nullptr;
  if (!PyArg_ParseTuple(args, "ss", &name, &text)) return nullptr;
  (timelineOf(self).*call)(name, text);
  Py_RETURN_NONE;
}

PyObject* recordNameOnly(PyObject* self, PyObject* args, NameOnly call) {
  const char* name = nullptr;
  if (!PyArg_ParseTuple(args, "s", &name)) return nullptr;
  (timelineOf(self).*call)(name);
  Py_RETURN_NONE;
}

PyObject* negotiateStart(PyObject* self, PyObject* args) {
  return recordNameText(self, args, &Timeline::negotiateStart);
}
PyObject* negotiateEnd(PyObject* self, PyObject* args) {
  return recordNameOnly(self, args, &Timeline::negotiateEnd);
}
PyObject* activityStart(PyObject* self, PyObject* args) {
  return recordNameText(self, args, &Timeline::activityStart);
}
PyObject* activityEnd(PyObject* self, PyObject* args) {
  return recordNameOnly(self, args, &Timeline::activityEnd);
}

PyObject* negotiateRankReady(PyObject* self, PyObject* args) {
  const char* name = nullptr;
  int rank = 0;
  if (!PyArg_ParseTuple(args, "si", &name, &rank)) return nullptr;
  timelineOf(self).negotiateRankReady(name, rank);
  Py_RETURN_NONE;
}

PyObject* opStart(PyObject* self, PyObject* args) {
  const char* name = nullptr;
  const char* op = nullptr;
  const char* dtype = nullptr;
  PyObject* shape = nullptr;
  if (!PyArg_ParseTuple(args, "sssO", &name, &op, &dtype, &shape)) return nullptr;
  int code = -1;
  for (int i = 0; i < hvd::common::kNumDataTypes; ++i) {
    if (std::string(hvd::common::dataTypeName(static_cast<hvd::common::DataType>(i))) == dtype) {
      code = i;
    }
  }
  if (code < 0) return PyErr_Format(PyExc_ValueError, "op_start: unknown dtype '%s'", dtype);
  std::vector<double> dims;
  if (!toDoubles(shape, &dims, "op_start: shape must be a sequence of ints")) return nullptr;
  timelineOf(self).start(name, op, static_cast<hvd::common::DataType>(code),
                         std::vector<int64_t>(dims.begin(), dims.end()));
  Py_RETURN_NONE;
}

PyObject* opEnd(PyObject* self, PyObject* args) {
  const char* name = nullptr;
  const char* error = nullptr;
  if (!PyArg_ParseTuple(args, "s|z", &name, &error)) return nullptr;
  timelineOf(self).end(name, error == nullptr ? "" : error);
  Py_RETURN_NONE;
}

PyObject* beginGroup(PyObject* self, PyObject* args) {
  const char* op = nullptr;
  if (!PyArg_ParseTuple(args, "s", &op)) return nullptr;
  timelineOf(self).beginGroup(op);
  Py_RETURN_NONE;
}

PyObject* activityStartGroup(PyObject* self, PyObject* args) {
  const char* activity = nullptr;
  if (!PyArg_ParseTuple(args, "s", &activity)) return nullptr;
  timelineOf(self).activityStartGroup(activity);
  Py_RETURN_NONE;
}

PyObject* activityEndGroup(PyObject* self, PyObject*) {
  timelineOf(self).activityEndGroup();
  Py_RETURN_NONE;
}

PyObject* endGroup(PyObject* self, PyObject* args) {
  const char* error = nullptr;
  if (!PyArg_ParseTuple(args, "|z", &error)) return nullptr;
  timelineOf(self).endGroup(error == nullptr ? "" : error);
  Py_RETURN_NONE;
}

// record_steps(tensors, steps, ranks=2) -> ns of recording calls per tensor: what the
// background loop records for one fused allreduce per step (negotiation with a tick per rank,
// then a response group with three activities), timed in C++ with the GIL released. Pauses
// between steps so the writer keeps up and nothing is dropped. For benchmarks/bench_timeline.
PyObject* recordSteps(PyObject* self, PyObject* args) {
  int tensors = 0, steps = 0, ranks = 2;
  if (!PyArg_ParseTuple(args, "ii|i", &tensors, &steps, &ranks)) return nullptr;
  if (tensors <= 0 || steps <= 0 || ranks <= 0) {
    return PyErr_Format(PyExc_ValueError, "record_steps: counts must be positive");
  }
  Timeline& tl = timelineOf(self);
  std::vector<std::string> names;
  for (int i = 0; i < tensors; ++i) names.push_back("allreduce.grad." + std::to_string(i));
  const std::vector<int64_t> shape{1024};
  std::chrono::nanoseconds spent{0};
  Py_BEGIN_ALLOW_THREADS
  for (int s = 0; s < steps; ++s) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int r = 0; r < ranks; ++r) {  // each rank's requests admitted in one loop
      hvd::timeline::ClockScope one_clock_read(&tl);
      for (const auto& n : names) {
        if (r == 0) tl.negotiateStart(n, "ALLREDUCE");
        tl.negotiateRankReady(n, r);
      }
    }
    {
      hvd::timeline::ClockScope one_clock_read(&tl);
      for (const auto& n : names) tl.negotiateEnd(n);
    }
    tl.beginGroup("ALLREDUCE");
    for (const auto& n : names) tl.start(n, "ALLREDUCE", hvd::common::DataType::kFloat32, shape);
    for (const char* a : {"MEMCPY_IN_FUSION_BUFFER", "SHM_ALLREDUCE", "MEMCPY_OUT_FUSION_BUFFER"}) {
      tl.activityStartGroup(a);
      tl.activityEndGroup();
    }
    tl.endGroup();
    spent += std::chrono::steady_clock::now() - t0;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  Py_END_ALLOW_THREADS
  return PyFloat_FromDouble(static_cast<double>(spent.count()) / (double(steps) * tensors));
}

PyObject* markCycle(PyObject* self, PyObject*) {
  timelineOf(self).markCycle();
  Py_RETURN_NONE;
}

PyObject* timelineRecent(PyObject* self, PyObject* args) {
  long long since = 0;
  if (!PyArg_ParseTuple(args, "|L", &since)) return nullptr;
  return recentEventsToList(timelineOf(self).recentEvents(since));
}

PyObject* timelineStats(PyObject* self, PyObject*) {
  const hvd::timeline::TimelineStats s = timelineOf(self).stats();
  return Py_BuildValue("{s:K,s:K,s:K,s:O,s:O,s:s}", "recorded", (unsigned long long)s.recorded,
                       "dropped", (unsigned long long)s.dropped, "written",
                       (unsigned long long)s.written, "file_open", s.file_open ? Py_True : Py_False,
                       "live", s.live ? Py_True : Py_False, "path", s.path.c_str());
}

PyMethodDef g_timeline_methods[] = {
    {"start", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(timelineStart)),
     METH_VARARGS | METH_KEYWORDS, "start(path, mark_cycles=False): open path, write header"},
    {"stop", timelineStop, METH_NOARGS, "stop(): drain, leave the file valid, close it"},
    {"set_live_capture", timelineLive, METH_O, "set_live_capture(on): feed recent_events()"},
    {"negotiate_start", negotiateStart, METH_VARARGS, "negotiate_start(name, op)"},
    {"negotiate_rank_ready", negotiateRankReady, METH_VARARGS, "negotiate_rank_ready(name, r)"},
    {"negotiate_end", negotiateEnd, METH_VARARGS, "negotiate_end(name)"},
    {"op_start", opStart, METH_VARARGS, "op_start(name, op, dtype, shape)"},
    {"activity_start", activityStart, METH_VARARGS, "activity_start(name, activity)"},
    {"activity_end", activityEnd, METH_VARARGS, "activity_end(name)"},
    {"op_end", opEnd, METH_VARARGS, "op_end(name, error=None)"},
    {"begin_group", beginGroup, METH_VARARGS, "begin_group(op): op_start calls that follow"},
    {"activity_start_group", activityStartGroup, METH_VARARGS, "activity_start_group(a)"},
    {"activity_end_group", activityEndGroup, METH_NOARGS, "activity_end_group()"},
    {"end_group", endGroup, METH_VARARGS, "end_group(error=None): end every member"},
    {"record_steps", recordSteps, METH_VARARGS, "record_steps(tensors, steps, ranks=2)"},
    {"mark_cycle", markCycle, METH_NOARGS, "mark_cycle(): CYCLE_START if marking cycles"},
    {"recent_events", timelineRecent, METH_VARARGS, "recent_events(since_us=0) -> list"},
    {"stats", timelineStats, METH_NOARGS, "stats() -> dict"},
    {nullptr, nullptr, 0, nullptr}};


PyType_Slot g_timeline_slots[] = {
    {Py_tp_new, reinterpret_cast<void*>(timelineNew)},
    {Py_tp_dealloc, reinterpret_cast<void*>(timelineDealloc)},
    {Py_tp_methods, g_timeline_methods},
    {Py_tp_doc, const_cast<char*>("A real Timeline driven from Python, for tests.")},
    {0, nullptr}};

PyType_Spec g_timeline_spec = {"_testhooks.TimelineWriterForTest", sizeof(TimelineObject),
                               0, Py_TPFLAGS_DEFAULT, g_timeline_slots};

}  // namespace

namespace hvd::testhooks {

int addTimelineWriter(PyObject* module) {
  PyObject* type = PyType_FromSpec(&g_timeline_spec);
  if (type == nullptr) return -1;
  if (PyModule_AddObject(module, "TimelineWriterForTest", type) < 0) {
    Py_DECREF(type);
    return -1;
  }
  return 0;
}

}  // namespace hvd::testhooks
