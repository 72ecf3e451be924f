// Binding code for metrics() and config_table(): converts the runtime's snapshot and the env
// table into plain Python dicts/lists (no numpy). Called from any Python thread.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "bindings/timeline_autotune.h"
#include "common/config.h"
#include "coord/message.h"
#include "runtime/runtime.h"

namespace {

void setItem(PyObject* dict, const char* key, PyObject* value) {
  PyDict_SetItemString(dict, key, value);
  Py_DECREF(value);
}

PyObject* stringList(const std::vector<std::string>& items) {
  PyObject* list = PyList_New(0);
  for (const auto& item : items) {
    PyObject* v = PyUnicode_FromString(item.c_str());
    PyList_Append(list, v);
    Py_DECREF(v);
  }
  return list;
}

PyObject* pendingList(const std::vector<hvd::runtime::PendingInfo>& pending) {
  PyObject* list = PyList_New(0);
  for (const auto& p : pending) {
    PyObject* missing = PyList_New(0);
    for (int r : p.missing_ranks) {
      PyObject* v = PyLong_FromLong(r);
      PyList_Append(missing, v);
      Py_DECREF(v);
    }
    PyObject* item = Py_BuildValue("{s:s,s:s,s:d,s:N}", "name", p.name.c_str(), "op",
                                   p.op.c_str(), "age_seconds", p.age_seconds, "missing_ranks",
                                   missing);
    PyList_Append(list, item);
    Py_DECREF(item);
  }
  return list;
}

}  // namespace

PyObject* buildMetrics() {
  auto& runtime = hvd::runtime::Runtime::instance();
  hvd::runtime::MetricsSnapshot s = runtime.metrics();
  PyObject* dict = PyDict_New();
  PyObject* ops = PyDict_New();
  PyObject* bytes = PyDict_New();
  for (int k = 0; k < hvd::runtime::kNumOpKinds; ++k) {
    const char* name = hvd::coord::opTypeName(static_cast<hvd::coord::OpType>(k));
    setItem(ops, name, PyLong_FromUnsignedLongLong(s.ops[k]));
    setItem(bytes, name, PyLong_FromUnsignedLongLong(s.bytes[k]));
  }
  setItem(dict, "rank", PyLong_FromLong(runtime.rank()));
  setItem(dict, "size", PyLong_FromLong(runtime.size()));
  setItem(dict, "initialized", PyBool_FromLong(runtime.initialized()));
  setItem(dict, "ops", ops);
  setItem(dict, "bytes", bytes);
  setItem(dict, "fused_batches", PyLong_FromUnsignedLongLong(s.fused_batches));
  setItem(dict, "fused_tensors", PyLong_FromUnsignedLongLong(s.fused_tensors));
  setItem(dict, "negotiate_seconds", PyFloat_FromDouble(s.negotiate_seconds));
  setItem(dict, "communicate_seconds", PyFloat_FromDouble(s.communicate_seconds));
  // wait_seconds is the loop idle, kept under its first name; idle_seconds says so plainly
  // and handle_wait_seconds is the framework threads' time blocked in wait().
  setItem(dict, "wait_seconds", PyFloat_FromDouble(s.wait_seconds));
  setItem(dict, "idle_seconds", PyFloat_FromDouble(s.wait_seconds));
  setItem(dict, "handle_wait_seconds", PyFloat_FromDouble(s.handle_wait_seconds));
  setItem(dict, "main_blocked_seconds", PyFloat_FromDouble(s.main_blocked_seconds));
  setItem(dict, "caller_driven_ops", PyLong_FromUnsignedLongLong(s.caller_driven_ops));
  setItem(dict, "caller_polled_ops", PyLong_FromUnsignedLongLong(s.caller_polled_ops));
  setItem(dict, "caller_spin_extended",
          PyLong_FromUnsignedLongLong(s.caller_spin_extended));
  setItem(dict, "one_round_ops", PyLong_FromUnsignedLongLong(s.one_round_ops));
  setItem(dict, "caller_spin_us", PyLong_FromLongLong(s.caller_spin_us));
  setItem(dict, "spin_yields", PyBool_FromLong(s.spin_yields));
  setItem(dict, "caller_spin_skipped",
          PyLong_FromUnsignedLongLong(s.caller_spin_skipped));
  setItem(dict, "caller_passes", PyLong_FromUnsignedLongLong(s.caller_passes));
  setItem(dict, "loop_wakeups", PyLong_FromUnsignedLongLong(s.loop_wakeups));
  setItem(dict, "tick_pickups", PyLong_FromUnsignedLongLong(s.tick_pickups));
  setItem(dict, "p2p_sent", PyLong_FromUnsignedLongLong(s.p2p_sent));
  setItem(dict, "p2p_sent_bytes", PyLong_FromUnsignedLongLong(s.p2p_sent_bytes));
  setItem(dict, "p2p_received", PyLong_FromUnsignedLongLong(s.p2p_received));
  setItem(dict, "p2p_received_bytes", PyLong_FromUnsignedLongLong(s.p2p_received_bytes));
  setItem(dict, "p2p_split_sent", PyLong_FromUnsignedLongLong(s.p2p_split_sent));
  setItem(dict, "p2p_split_received", PyLong_FromUnsignedLongLong(s.p2p_split_received));
  setItem(dict, "p2p_split_refused", PyLong_FromUnsignedLongLong(s.p2p_split_refused));
  setItem(dict, "queue_depth", PyLong_FromUnsignedLongLong(s.queue_depth));
  setItem(dict, "last_error", PyUnicode_FromString(s.last_error.c_str()));
  PyObject* current = Py_None;
  Py_INCREF(Py_None);
  if (!s.current_op.empty()) {
    Py_DECREF(Py_None);
    current = Py_BuildValue("{s:s,s:s,s:d}", "op", s.current_op.c_str(), "name",
                            s.current_name.c_str(), "seconds", s.current_seconds);
  }
  setItem(dict, "current", current);
  setItem(dict, "pending", pendingList(s.pending));
  PyObject* shutting_down = PyList_New(static_cast<Py_ssize_t>(s.shutting_down.size()));
  for (size_t i = 0; i < s.shutting_down.size(); ++i) {
    PyList_SET_ITEM(shutting_down, static_cast<Py_ssize_t>(i),
                    PyLong_FromLong(s.shutting_down[i]));
  }
  setItem(dict, "shutting_down_ranks", shutting_down);
  setItem(dict, "transports", stringList(s.transports));
  setItem(dict, "control_transports", stringList(s.control_transports));
  setItem(dict, "cpu_binding", PyUnicode_FromString(s.cpu_binding.c_str()));
  setItem(dict, "host_copy", PyUnicode_FromString(s.host_copy.c_str()));
  setItem(dict, "host_copy_reason", PyUnicode_FromString(s.host_copy_reason.c_str()));
  setItem(dict, "single_copy_ops", PyLong_FromUnsignedLongLong(s.single_copy_ops));
  setItem(dict, "host_chunks", PyLong_FromUnsignedLongLong(s.host_chunks));
  setItem(dict, "helper_reads", PyLong_FromUnsignedLongLong(s.helper_reads));
  setItem(dict, "shared_outputs", PyBool_FromLong(s.shared_outputs ? 1 : 0));
  setItem(dict, "shared_outputs_reason", PyUnicode_FromString(s.shared_outputs_reason.c_str()));
  setItem(dict, "shared_output_ops", PyLong_FromUnsignedLongLong(s.shared_output_ops));
  setItem(dict, "peer_block_maps", PyLong_FromUnsignedLongLong(s.peer_block_maps));
  setItem(dict, "shared_output_fallbacks",
          PyLong_FromUnsignedLongLong(s.shared_output_fallbacks));
  setItem(dict, "single_copy_probes", PyLong_FromUnsignedLongLong(s.single_copy_probes));
  // {process set id: {"path": "nccl" | "staged", "device": ordinal}} for sets that ran CUDA
  // collectives: what the dashboard shows as the rank's GPU path.
  PyObject* gpu_paths = PyDict_New();
  for (const auto& p : s.device_paths) {
    PyObject* key = PyLong_FromLong(p.process_set);
    PyObject* value = Py_BuildValue("{s:s,s:i}", "path", p.path.c_str(), "device", p.device);
    PyDict_SetItem(gpu_paths, key, value);
    Py_DECREF(key);
    Py_DECREF(value);
  }
  setItem(dict, "gpu_paths", gpu_paths);
  const hvd::timeline::TimelineStats timeline = runtime.timelineStats();
  setItem(dict, "timeline", PyBool_FromLong(timeline.file_open));
  setItem(dict, "timeline_dropped", PyLong_FromUnsignedLongLong(timeline.dropped));
  PyObject* autotune = hvd::bindings::autotuneForMetrics();
  PyObject* events = hvd::bindings::eventsForMetrics();
  if (autotune == nullptr || events == nullptr) {
    Py_XDECREF(autotune);
    Py_XDECREF(events);
    Py_DECREF(dict);
    return nullptr;
  }
  setItem(dict, "autotune", autotune);
  setItem(dict, "events", events);
  return dict;
}

PyObject* buildConfigTable() {
  PyObject* list = PyList_New(0);
  for (const auto& e : hvd::common::configTable()) {
    PyObject* item = Py_BuildValue("(szsss)", e.name, e.alias, e.type, e.default_value, e.doc);
    PyList_Append(list, item);
    Py_DECREF(item);
  }
  return list;
}
