// engine_native._core.Buffer (bindings/buffer.cc): core-owned output memory for Python.
// Binding code only; called with the GIL held.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <memory>

#include "runtime/handle_table.h"

namespace hvd::bindings {

// The Buffer type, created at the first call (nullptr with an exception on failure).
PyTypeObject* bufferType();
// A new Buffer holding a reference to `buffer`.
PyObject* wrapBuffer(const std::shared_ptr<runtime::OutputBuffer>& buffer);

}  // namespace hvd::bindings
