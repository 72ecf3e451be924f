// engine_native._core: the CPython binding. Binding code only — argument conversion, GIL
// release around blocking calls, Status -> exception mapping. The contract is written in
// engine_native/_core.pyi. Tensors cross as raw pointers plus metadata (no numpy/torch here).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "bindings/buffer.h"
#include "bindings/core_calls.h"
#include "bindings/enqueue_args.h"
#include "bindings/jit_interrupt.h"
#include "bindings/nccl.h"
#include "bindings/numpy_api.h"
#include "bindings/peer_api.h"
#include "bindings/torch_api.h"
#include "bindings/timeline_autotune.h"
#include "common/config.h"
#include "common/cpu_ranges.h"
#include "common/cpu_relax.h"
#include "common/test_switch.h"
#include "runtime/runtime.h"

namespace {

using hvd::common::Code;
using hvd::common::Status;
using hvd::runtime::Runtime;

PyObject* g_internal_error = nullptr;  // engine_native._core.HorovodInternalError

PyObject* raise(const Status& status) {
  PyObject* type = g_internal_error;
  if (status.code() == Code::kInvalidArgument) type = PyExc_ValueError;
  if (status.code() == Code::kTypeError) type = PyExc_TypeError;
  PyErr_SetString(type, status.message().c_str());
  return nullptr;
}

// ---- conversions ---------------------------------------------------------------------------

PyObject* int64Tuple(const std::vector<int64_t>& values) {
  PyObject* t = PyTuple_New(static_cast<Py_ssize_t>(values.size()));
  for (size_t i = 0; i < values.size(); ++i) {
    PyTuple_SET_ITEM(t, i, PyLong_FromLongLong(values[i]));
  }
  return t;
}

PyObject* submit(std::vector<hvd::runtime::EnqueueArgs> ops, bool wake) {
  std::vector<int64_t> handles;
  Status status = Runtime::instance().enqueue(std::move(ops), &handles, wake);
  if (!status.isOk()) return raise(status);
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(handles.size()));
  for (size_t i = 0; i < handles.size(); ++i) {
    PyList_SET_ITEM(list, i, PyLong_FromLongLong(handles[i]));
  }
  return list;
}

PyObject* submitOne(hvd::runtime::EnqueueArgs&& op, bool wake) {
  int64_t handle = 0;
  Status status = Runtime::instance().enqueue(std::move(op), &handle, wake);
  if (!status.isOk()) return raise(status);
  return PyLong_FromLongLong(handle);
}

// ---- module functions ----------------------------------------------------------------------

PyObject* pyListen(PyObject*, PyObject* args) {
  const char* address = nullptr;
  if (!PyArg_ParseTuple(args, "s", &address)) return nullptr;
  int port = 0;
  Status status = Runtime::instance().listen(address, &port);
  if (!status.isOk()) return raise(status);
  return PyLong_FromLong(port);
}

// Peer `rank`'s CPUs (transport::PeerInfo::cpus): the kernel's CPU list format.
bool parseCpus(Py_ssize_t rank, const char* text, hvd::common::CpuRanges* cpus) {
  if (hvd::common::parseCpuRanges(text, cpus)) return true;
  std::string shown(text, ::strnlen(text, 40));
  PyErr_Format(PyExc_ValueError,
               "peer %zd's CPUs '%s': expected a CPU list as the kernel writes it ('0-3,8': "
               "ascending, each CPU below 8192)", rank, shown.c_str());
  return false;
}

// A Python list of `values` (nullptr, an exception set, where an allocation failed).
PyObject* intList(const std::vector<int>& values) {
  PyObject* list = PyList_New(static_cast<Py_ssize_t>(values.size()));
  if (list == nullptr) return nullptr;
  for (size_t i = 0; i < values.size(); ++i) {
    PyObject* value = PyLong_FromLong(values[i]);
    if (value == nullptr) {
      Py_DECREF(list);  // unset items are NULL, which list dealloc skips
      return nullptr;
    }
    PyList_SET_ITEM(list, static_cast<Py_ssize_t>(i), value);
  }
  return list;
}

PyObject* pyProcessCpus(PyObject*, PyObject*) {
  const std::string text =
      hvd::common::formatCpuRanges(hvd::common::cpuRangesOf(hvd::common::processCpuMask()));
  return PyUnicode_FromStringAndSize(text.data(), static_cast<Py_ssize_t>(text.size()));
}

PyObject* pyInit(PyObject*, PyObject* args) {
  int rank = 0;
  PyObject* peers_seq = nullptr;
  Py_buffer secret;
  const char* job_id = nullptr;
  if (!PyArg_ParseTuple(args, "iOy*s", &rank, &peers_seq, &secret, &job_id)) return nullptr;
  std::string secret_bytes(static_cast<const char*>(secret.buf), secret.len);
  PyBuffer_Release(&secret);
  std::vector<hvd::transport::PeerInfo> peers;
  PyObject* fast = PySequence_Fast(peers_seq, "peers must be a sequence");
  if (fast == nullptr) return nullptr;
  for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(fast); ++i) {
    const char* host = nullptr;
    const char* address = nullptr;
    int port = 0;
    long long pid = 0;
    const char* machine = nullptr;
    const char* cpus = nullptr;
    const char* pid_namespace = nullptr;
    hvd::transport::PeerInfo peer;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(fast, i), "ssiLsss", &host, &address, &port,
                          &pid, &machine, &cpus, &pid_namespace) ||
        !parseCpus(i, cpus, &peer.cpus)) {
      Py_DECREF(fast);
      return nullptr;
    }
    peer.host_id = host;
    peer.address = address;
    peer.port = port;
    peer.pid = pid;
    peer.machine_id = machine;
    peer.pid_namespace = pid_namespace;
    peers.push_back(std::move(peer));
  }
  Py_DECREF(fast);
  Status status;
  std::string job(job_id);
  Py_BEGIN_ALLOW_THREADS
  status = Runtime::instance().init(rank, peers, secret_bytes, job);
  Py_END_ALLOW_THREADS
  if (!status.isOk()) return raise(status);
  Py_RETURN_NONE;
}

PyObject* pyShutdown(PyObject*, PyObject*) {
  Py_BEGIN_ALLOW_THREADS
  Runtime::instance().shutdown();
  Py_END_ALLOW_THREADS
  Py_RETURN_NONE;
}

PyObject* pyAbort(PyObject*, PyObject* args) {
  const char* reason = "";
  if (!PyArg_ParseTuple(args, "|s", &reason)) return nullptr;
  Runtime::instance().abort(reason);
  Py_RETURN_NONE;
}

PyObject* pyIsInitialized(PyObject*, PyObject*) {
  return PyBool_FromLong(Runtime::instance().initialized());
}
PyObject* pyRank(PyObject*, PyObject*) { return PyLong_FromLong(Runtime::instance().rank()); }
PyObject* pySize(PyObject*, PyObject*) { return PyLong_FromLong(Runtime::instance().size()); }

PyObject* pyEnqueue(PyObject*, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  hvd::runtime::EnqueueArgs op;
  if (!hvd::bindings::parseEnqueueArgs(args, nargs, kwnames, &op)) return nullptr;
  return submitOne(std::move(op), /*wake=*/true);
}

// For a caller that calls wait() on the handle next: the background thread is not woken, the
// wait drives the op on the caller's thread (Note [Caller drives] in background_loop.cc).
PyObject* pyEnqueueForWait(PyObject*, PyObject* const* args, Py_ssize_t nargs,
                           PyObject* kwnames) {
  hvd::runtime::EnqueueArgs op;
  if (!hvd::bindings::parseEnqueueArgs(args, nargs, kwnames, &op)) return nullptr;
  return submitOne(std::move(op), /*wake=*/false);
}

// enqueue_group(ops, waited=False): waited, as enqueue_for_wait, for a caller that waits for
// the whole group next (its waits drive it: Note [Caller drives] in background_loop.cc).
PyObject* pyEnqueueGroup(PyObject*, PyObject* args) {
  PyObject* seq = nullptr;
  int waited = 0;
  if (!PyArg_ParseTuple(args, "O|p", &seq, &waited)) return nullptr;
  PyObject* fast = PySequence_Fast(seq, "enqueue_group() takes a sequence of tuples");
  if (fast == nullptr) return nullptr;
  std::vector<hvd::runtime::EnqueueArgs> ops(PySequence_Fast_GET_SIZE(fast));
  // The tuples stay referenced until the ops are submitted: the names are views into them.
  std::vector<PyObject*> tuples;
  bool ok = true;
  for (size_t i = 0; ok && i < ops.size(); ++i) {
    PyObject* tuple = PySequence_Tuple(PySequence_Fast_GET_ITEM(fast, i));
    if (tuple != nullptr) tuples.push_back(tuple);
    ok = tuple != nullptr && hvd::bindings::parseEnqueueTuple(tuple, &ops[i]);
  }
  PyObject* handles = ok ? submit(std::move(ops), /*wake=*/waited == 0) : nullptr;
  for (PyObject* tuple : tuples) Py_DECREF(tuple);
  Py_DECREF(fast);
  return handles;
}

// poll(handle, free_name=True): done answers also free the op's name (Note [Name lifetime]
// in runtime/handle_table.h); a group's poll asks each member with free_name=False first.
PyObject* pyPoll(PyObject*, PyObject* args) {
  long long handle = 0;
  int free_name = 1;
  if (!PyArg_ParseTuple(args, "L|p", &handle, &free_name)) return nullptr;
  auto& handles = Runtime::instance().handles();
  const int state = free_name ? handles.observe(handle) : handles.poll(handle);
  if (state < 0) {
    PyErr_Format(PyExc_ValueError, "poll(): unknown or already released handle %lld", handle);
    return nullptr;
  }
  return PyBool_FromLong(state);
}

PyObject* resultToPython(const hvd::runtime::OpResult& result) {
  if (result.last_joined_rank >= 0) return PyLong_FromLong(result.last_joined_rank);
  if (result.dtype >= 0) {  // a point-to-point receive; no buffer: written into its `into`
    PyObject* buffer =
        result.buffer ? hvd::bindings::wrapBuffer(result.buffer) : Py_NewRef(Py_None);
    if (buffer == nullptr) return nullptr;
    return Py_BuildValue("(NNi)", buffer, int64Tuple(result.shape), result.dtype);
  }
  if (!result.buffer) Py_RETURN_NONE;
  PyObject* buffer = hvd::bindings::wrapBuffer(result.buffer);
  if (buffer == nullptr) return nullptr;
  if (!result.received_splits.empty()) {
    return Py_BuildValue("(NNN)", buffer, int64Tuple(result.shape),
                         int64Tuple(result.received_splits));
  }
  return Py_BuildValue("(NN)", buffer, int64Tuple(result.shape));
}

PyObject* pyWait(PyObject*, PyObject* arg) {
  const long long handle = PyLong_AsLongLong(arg);
  if (handle == -1 && PyErr_Occurred()) return nullptr;
  return hvd::bindings::waitHandle(handle);
}

}  // namespace

namespace hvd::bindings {

PyObject* raiseStatus(const Status& status) { return raise(status); }

namespace {

unsigned long g_main_thread = 0;  // threading.main_thread().ident, read at import

// Marks the main thread's blocking wait for metrics()["main_blocked_seconds"]
// (Note [Blocked main thread] in runtime/metrics.h). Other threads are not marked.
class MainBlocked {
 public:
  MainBlocked() : main_(PyThread_get_thread_ident() == g_main_thread) {
    if (main_) Runtime::instance().setMainBlocked(true);
  }
  ~MainBlocked() {
    if (main_) Runtime::instance().setMainBlocked(false);
  }
  MainBlocked(const MainBlocked&) = delete;
  MainBlocked& operator=(const MainBlocked&) = delete;

 private:
  bool main_;
};

}  // namespace

static bool readMainThread() {
  PyObject* threading = PyImport_ImportModule("threading");
  if (threading == nullptr) return false;
  PyObject* main = PyObject_CallMethod(threading, "main_thread", nullptr);
  Py_DECREF(threading);
  if (main == nullptr) return false;
  PyObject* ident = PyObject_GetAttrString(main, "ident");
  Py_DECREF(main);
  if (ident == nullptr) return false;
  g_main_thread = PyLong_AsUnsignedLong(ident);
  Py_DECREF(ident);
  return !PyErr_Occurred();
}

constexpr int kWaitSliceMs = 50;  // signals are checked between slices

// The one wait, for both kinds of caller: a Python thread (`holds_gil`: the GIL is released
// around the drive and each slice's wait only, as Python objects may go with the handle, and
// Ctrl-C is checked between slices) and a thread without the GIL (bindings/jax_ffi.cc's handler
// on XLA's threads: it waits until the op ends). A wait inside jax.jit (`jit_op`, the handler's
// or an io_callback's label) checks no Python signal: Ctrl-C aborts it instead (Note [Ctrl-C
// inside jax.jit] in bindings/jit_interrupt.h).
static bool waitOn(int64_t handle, Status* status, hvd::runtime::OpResult* result,
                   bool holds_gil, std::string_view jit_op) {
  auto& handles = Runtime::instance().handles();
  // Already finished (the rest of a fused batch): one lock, no waiting.
  if (handles.takeIfDone(handle, status, result)) return true;
  hvd::runtime::HandleTable::WaitScope in_wait(handles);  // before drive() runs a pass
  // Time blocked here is metrics()["handle_wait_seconds"] (framework threads waiting).
  const auto t0 = std::chrono::steady_clock::now();
  auto blocked = [&t0]() {
    Runtime::instance().addHandleWait(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  };
  struct GilReleased {  // restored however fn leaves
    explicit GilReleased(bool release) : saved(release ? PyEval_SaveThread() : nullptr) {}
    ~GilReleased() {
      if (saved != nullptr) PyEval_RestoreThread(saved);
    }
    PyThreadState* saved;
  };
  auto without_gil = [holds_gil](auto&& fn) {
    GilReleased released(holds_gil);
    fn();
  };
  bool driven = false;
  without_gil([handle, &driven] { driven = Runtime::instance().drive(handle); });
  // Its drive finished it (a small op of a host's ranks, mostly): taken at once, without a
  // second release of the GIL and the device and peer checks of a slice.
  if (driven && handles.takeIfDone(handle, status, result)) {
    blocked();
    return true;
  }
  MainBlocked marked;
  std::optional<hvd::bindings::JitInterruptWatch> watch;
  if (!jit_op.empty()) watch.emplace(jit_op);
  while (true) {
    bool done = false;
    without_gil([&] {
      // Its CUDA op's event, polled here when its drive queued the op (Note [Caller waits on
      // the device] in runtime/device_executor.cc); a point-to-point op's peer doorbell (Note
      // [Caller sleeps on the doorbell] in runtime/peer_await.cc); else the handle's condition
      // variable.
      const bool awaited = Runtime::instance().awaitDevice(handle, kWaitSliceMs, t0) ||
                           Runtime::instance().awaitPeer(handle, kWaitSliceMs);
      done = handles.waitFor(handle, awaited ? 0 : kWaitSliceMs, status, result);
    });
    if (done) break;
    if (watch) {  // inside jit: the op ends failed once a Ctrl-C aborted the core
      without_gil([&watch] { watch->abortIfInterrupted(); });
      continue;
    }
    // Between slices: let Ctrl-C (or an ipyparallel signal) reach the caller. The op stays
    // pending; the Python layer decides whether to abort().
    if (holds_gil && PyErr_CheckSignals() != 0) {
      blocked();
      return false;
    }
  }
  blocked();
  handles.release(handle);
  return true;
}

bool awaitResult(int64_t handle, Status* status, hvd::runtime::OpResult* result,
                 std::string_view jit_op) {
  return waitOn(handle, status, result, /*holds_gil=*/false, jit_op);
}

bool waitResult(int64_t handle, Status* status, hvd::runtime::OpResult* result) {
  return waitOn(handle, status, result, /*holds_gil=*/true, jitCallbackLabel());
}

PyObject* waitHandle(int64_t handle) {
  Status status;
  hvd::runtime::OpResult result;
  if (!waitResult(handle, &status, &result)) return nullptr;
  if (!status.isOk()) return raise(status);
  return resultToPython(result);
}

}  // namespace hvd::bindings

namespace {

PyObject* pyAddProcessSet(PyObject*, PyObject* args) {
  PyObject* seq = nullptr;
  if (!PyArg_ParseTuple(args, "O", &seq)) return nullptr;
  std::vector<int64_t> ranks64;
  if (!hvd::bindings::toInt64List(seq, &ranks64, "ranks must be a sequence of ints")) {
    return nullptr;
  }
  std::vector<int> ranks(ranks64.begin(), ranks64.end());
  int32_t id = 0;
  Status status = Runtime::instance().addProcessSet(ranks, &id);
  if (!status.isOk()) return raise(status);
  return PyLong_FromLong(id);
}

PyObject* pyRemoveProcessSet(PyObject*, PyObject* args) {
  int id = 0;
  if (!PyArg_ParseTuple(args, "i", &id)) return nullptr;
  Status status = Runtime::instance().removeProcessSet(id);
  if (!status.isOk()) return raise(status);
  Py_RETURN_NONE;
}

PyObject* pyProcessSetRanks(PyObject*, PyObject* args) {
  int id = 0;
  if (!PyArg_ParseTuple(args, "i", &id)) return nullptr;
  auto members = Runtime::instance().processSetRanks(id);
  if (!members) {
    PyErr_Format(PyExc_ValueError, "process set %d is not registered", id);
    return nullptr;
  }
  return intList(*members);
}

}  // namespace

PyObject* buildMetrics();     // bindings/metrics.cc
PyObject* buildConfigTable();  // bindings/metrics.cc

namespace {

PyObject* pyMetrics(PyObject*, PyObject*) { return buildMetrics(); }
PyObject* pyConfigTable(PyObject*, PyObject*) { return buildConfigTable(); }

PyMethodDef g_methods[] = {
    {"listen", pyListen, METH_VARARGS, "Bind the listener; returns the port."},
    {"init", pyInit, METH_VARARGS, "Connect to every peer and start the background thread."},
    {"process_cpus", pyProcessCpus, METH_NOARGS,
     "The CPUs this process could run on when the core first asked (before any binding)."},
    {"shutdown", pyShutdown, METH_NOARGS, "Shut the core down (bounded)."},
    {"abort", pyAbort, METH_VARARGS, "Cancel everything in flight on every rank."},
    {"is_initialized", pyIsInitialized, METH_NOARGS, "True between init() and shutdown()."},
    {"rank", pyRank, METH_NOARGS, "This process's global rank (-1 before init)."},
    {"size", pySize, METH_NOARGS, "Number of ranks (0 before init)."},
    {"enqueue", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pyEnqueue)),
     METH_FASTCALL | METH_KEYWORDS, "Submit one op; returns a handle."},
    {"enqueue_for_wait",
     reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(pyEnqueueForWait)),
     METH_FASTCALL | METH_KEYWORDS,
     "enqueue() for an op the caller waits for next: that wait drives it on this thread."},
    {"enqueue_group", pyEnqueueGroup, METH_VARARGS,
     "enqueue_group(ops, waited=False): submit several ops atomically; waited: the caller "
     "waits for them next, and its waits drive them."},
    {"poll", pyPoll, METH_VARARGS,
     "True when the op finished (then its name is free again, unless free_name=False). Never "
     "blocks."},
    {"wait", pyWait, METH_O, "Block until the op finishes; returns its result."},
    {"add_process_set", pyAddProcessSet, METH_VARARGS, "Register a process set; returns id."},
    {"remove_process_set", pyRemoveProcessSet, METH_VARARGS, "Remove a process set."},
    {"process_set_ranks", pyProcessSetRanks, METH_VARARGS, "Members of a process set."},
    {"metrics", pyMetrics, METH_NOARGS, "Snapshot of the core's counters."},
    {"config_table", pyConfigTable, METH_NOARGS, "Every HVD_* knob with its doc."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef g_module = {PyModuleDef_HEAD_INIT, "_core",
                        "Native allreduce core of engine_native.", -1, g_methods,
                        nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__core() {
  PyTypeObject* buffer_type = hvd::bindings::bufferType();
  if (buffer_type == nullptr) return nullptr;
  PyObject* module = PyModule_Create(&g_module);
  if (module == nullptr) return nullptr;
  if (!hvd::bindings::readMainThread()) return nullptr;
  g_internal_error = PyErr_NewExceptionWithDoc(
      "engine_native._core.HorovodInternalError",
      "A collective failed: mismatch across ranks, lost peer, timeout, abort or shutdown.",
      PyExc_RuntimeError, nullptr);
  Py_INCREF(g_internal_error);
  PyModule_AddObject(module, "HorovodInternalError", g_internal_error);
  Py_INCREF(buffer_type);
  PyModule_AddObject(module, "Buffer", reinterpret_cast<PyObject*>(buffer_type));
  const char* kinds[] = {"ALLREDUCE", "ALLGATHER", "BROADCAST", "ALLTOALL",
                         "REDUCESCATTER", "BARRIER", "JOIN"};
  for (int i = 0; i < 7; ++i) PyModule_AddIntConstant(module, kinds[i], i);
  // Whether HVD_TEST_* fault switches are compiled in (common/test_switch.h): tests that
  // need one fail with a rebuild hint when they are not.
  PyModule_AddIntConstant(module, "TEST_SWITCHES", hvd::common::kTestSwitches ? 1 : 0);
  if (addTimelineAutotuneBindings(module) < 0) return nullptr;
  if (addNcclBindings(module) < 0) return nullptr;
  if (hvd::bindings::addNumpyBindings(module) < 0) return nullptr;
  if (hvd::bindings::addTorchBindings(module) < 0) return nullptr;
  if (hvd::bindings::addTorchGroupBindings(module) < 0) return nullptr;
  if (hvd::bindings::addPeerBindings(module) < 0) return nullptr;
  if (hvd::bindings::addJitInterruptBindings(module) < 0) return nullptr;
  return module;
}
