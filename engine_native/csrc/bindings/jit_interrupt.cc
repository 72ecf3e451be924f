// Note [Ctrl-C inside jax.jit] (bindings/jit_interrupt.h): the chained SIGINT handler, the
// per-wait watch, the io_callback thread label, and the next step a sticky failure names.
#include "bindings/jit_interrupt.h"

#include <signal.h>

#include <atomic>
#include <mutex>

#include "runtime/runtime.h"

namespace hvd::bindings {
namespace {

using common::Code;
using common::Status;

std::atomic<uint64_t> g_sigints{0};
// The handler ours calls after counting (Python's). Written under g_install_mutex, only while
// ours is not the installed one; read by ours.
struct sigaction g_previous;
std::mutex g_install_mutex;

void countThenChain(int sig, siginfo_t* info, void* context) {
  g_sigints.fetch_add(1, std::memory_order_relaxed);  // lock-free: async-signal-safe
  if (g_previous.sa_flags & SA_SIGINFO) {
    g_previous.sa_sigaction(sig, info, context);
  } else if (g_previous.sa_handler != SIG_DFL && g_previous.sa_handler != SIG_IGN) {
    g_previous.sa_handler(sig);
  }
}

bool installed(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) && action.sa_sigaction == countThenChain;
}

bool isFunction(const struct sigaction& action) {
  return (action.sa_flags & SA_SIGINFO) ||
         (action.sa_handler != SIG_DFL && action.sa_handler != SIG_IGN);
}

// Puts countThenChain in front of the current SIGINT handler when that is a function and not
// ours already: one sigaction() read per wait that gets here, a second one to install.
void chainInFront() {
  struct sigaction current {};
  if (sigaction(SIGINT, nullptr, &current) != 0 || installed(current) || !isFunction(current)) {
    return;
  }
  std::lock_guard<std::mutex> lock(g_install_mutex);
  if (sigaction(SIGINT, nullptr, &current) != 0 || installed(current) || !isFunction(current)) {
    return;  // another wait installed it meanwhile
  }
  g_previous = current;
  struct sigaction ours = current;  // the same mask and flags (SA_ONSTACK, no SA_RESTART)
  ours.sa_flags |= SA_SIGINFO;
  ours.sa_sigaction = countThenChain;
  sigaction(SIGINT, &ours, nullptr);
}

thread_local std::string t_callback_label;

}  // namespace

JitInterruptWatch::JitInterruptWatch(std::string_view op) : op_(op) {
  chainInFront();
  mark_ = g_sigints.load(std::memory_order_relaxed);
}

bool JitInterruptWatch::abortIfInterrupted() {
  if (aborted_ || g_sigints.load(std::memory_order_relaxed) == mark_) return false;
  aborted_ = true;
  runtime::Runtime::instance().abort("interrupted (SIGINT, Ctrl-C) while waiting inside jax.jit "
                                     "for " + op_ + ", which cannot stay pending there: XLA "
                                     "frees its buffers when the call returns");
  return true;
}

const std::string& jitCallbackLabel() { return t_callback_label; }

std::string nextStep(const Status& status) {
  const Code code = status.code();
  if (code != Code::kPeerLost && code != Code::kTimeout && code != Code::kAborted) return {};
  return " (the core stays failed: every later op fails with this error until hvd.shutdown() "
         "and hvd.init() on every rank; after a rank died, start the job again)";
}

std::string withNextStep(const Status& status) { return status.message() + nextStep(status); }

namespace {

PyObject* pyJitCallbackLabel(PyObject*, PyObject* label) {
  if (label == Py_None) {
    t_callback_label.clear();
    Py_RETURN_NONE;
  }
  Py_ssize_t size = 0;
  const char* text = PyUnicode_AsUTF8AndSize(label, &size);
  if (text == nullptr) return nullptr;
  t_callback_label.assign(text, static_cast<size_t>(size));
  Py_RETURN_NONE;
}

PyObject* pyCoreFailure(PyObject*, PyObject*) {
  const Status status = runtime::Runtime::instance().failure();
  if (status.isOk()) Py_RETURN_NONE;
  return Py_BuildValue("(ss)", status.message().c_str(), nextStep(status).c_str());
}

PyMethodDef g_methods[] = {
    {"jit_callback_label", pyJitCallbackLabel, METH_O,
     "jit_callback_label(label or None): this thread's waits belong to the jitted op `label` "
     "(an ordered io_callback) until None: Ctrl-C aborts them (Note [Ctrl-C inside jax.jit])."},
    {"core_failure", pyCoreFailure, METH_NOARGS,
     "core_failure(): None, or (message, what to do) of the failure (lost rank, timeout, "
     "abort) every op now fails with until shutdown()."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int addJitInterruptBindings(PyObject* module) {
  return PyModule_AddFunctions(module, g_methods);
}

}  // namespace hvd::bindings
