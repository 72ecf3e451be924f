// Waits inside jax.jit: Ctrl-C seen by the wait itself, and what a failed op there says to do.
// Binding code only (bindings/jit_interrupt.cc).
//
// Note [Ctrl-C inside jax.jit]
// A collective inside jax.jit waits on the thread XLA runs the program on: the caller's thread
// for a small program, one of XLA's threads for a larger one (measured with jaxlib 0.10.2: a
// lone allreduce ran on the main thread, one after 40 matmuls on another while the main thread
// sat in block_until_ready). Python runs its signal handlers on the main thread only, between
// bytecodes, and that thread is inside XLA until the program ends: Ctrl-C's KeyboardInterrupt
// would come when the op ends, never if a peer never starts it. Torch's wait raises at once
// and leaves its op pending, its tensors kept alive (Note [Handle lifetime] in
// engine_native/torch/runtime.py); an op inside jit cannot stay pending, as it reads and writes
// XLA's buffers, which XLA frees or reuses once the call returns. So such a wait (the FFI
// handler's, bindings/jax_ffi.cc, and the ordered io_callback's, which labels its thread)
// watches SIGINT itself: a handler chained in front of Python's counts each SIGINT and then
// calls Python's, so Python still raises KeyboardInterrupt when the program has returned. A
// wait that sees the count move aborts the core (every rank's pending ops fail, naming this
// rank and the op), waits for its op to end and returns that error; Python's other signal
// handlers run after the program, as for any XLA call. The chained handler goes in only over a
// handler function (Python's): SIG_IGN and SIG_DFL are left alone, and a handler Python
// installs later replaces it until the next such wait puts it back in front.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace hvd::bindings {

// Note [Ctrl-C inside jax.jit], for one wait: the SIGINT count when the wait began, and the op
// it names when it aborts the core.
class JitInterruptWatch {
 public:
  explicit JitInterruptWatch(std::string_view op);
  // True once, when a SIGINT arrived since construction: the core is then aborted, with a
  // reason naming the op, and the caller goes on waiting for its op to fail.
  bool abortIfInterrupted();

 private:
  uint64_t mark_;
  std::string op_;
  bool aborted_ = false;
};

// The jitted op this thread's waits belong to, set around an ordered io_callback by
// _core.jit_callback_label(); empty outside one.
const std::string& jitCallbackLabel();

// What to do after a failure that leaves the core failed (a lost rank, a timeout, an abort:
// sticky until shutdown()), as text to append to its message; empty for any other Status.
std::string nextStep(const common::Status& status);
// The Status's message with nextStep() appended.
std::string withNextStep(const common::Status& status);

// _core.jit_callback_label(label or None) and _core.core_failure().
int addJitInterruptBindings(PyObject* module);

}  // namespace hvd::bindings
