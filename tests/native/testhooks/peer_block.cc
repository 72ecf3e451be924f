// check_peer_block (testhooks/hooks.h): algo/peer_block.h's check on numbers the tests choose,
// including the ones no live peer publishes (an offset near 2^64, a size that disagrees).
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include "algo/peer_block.h"
#include "testhooks/hooks.h"

namespace hvd::testhooks {
namespace {

// check_peer_block(op, local, input_bytes, at, published, want) -> None, or RuntimeError with
// the core's message.
PyObject* checkPeerBlock(PyObject*, PyObject* args) {
  const char* op = nullptr;
  int local = 0;
  unsigned long long input_bytes = 0, at = 0, published = 0, want = 0;
  if (!PyArg_ParseTuple(args, "siKKKK", &op, &local, &input_bytes, &at, &published, &want)) {
    return nullptr;
  }
  const common::Status s = algo::checkPeerBlock(op, local, input_bytes, at, published, want);
  if (!s.isOk()) {
    PyErr_SetString(PyExc_RuntimeError, s.message().c_str());
    return nullptr;
  }
  Py_RETURN_NONE;
}

PyMethodDef g_methods[] = {
    {"check_peer_block", checkPeerBlock, METH_VARARGS,
     "algo::checkPeerBlock(op, local, input_bytes, at, published, want): None or RuntimeError"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

int addPeerBlockHooks(PyObject* module) { return PyModule_AddFunctions(module, g_methods); }

}  // namespace hvd::testhooks
