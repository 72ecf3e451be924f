// The point-to-point calls of engine_native._core (p2p_send, p2p_recv), for the Python layer
// in engine_native/p2p.py. Binding code only; registered by PyInit__core.
#pragma once

#define PY_SSIZE_T_CLEAN
#include <Python.h>

namespace hvd::bindings {

int addPeerBindings(PyObject* module);

}  // namespace hvd::bindings
