// engine_native._core's point-to-point calls (bindings/peer_api.h). The Python layer keeps a
// sent array alive until its handle completes (Note [Handle lifetime]); a receive's handle
// waits to (Buffer, shape, dtype code).
#include "bindings/peer_api.h"

#include <cstdint>
#include <vector>

#include "bindings/core_calls.h"
#include "bindings/enqueue_args.h"
#include "common/dtype.h"
#include "runtime/runtime.h"
#include "transport/peer_frame.h"

namespace hvd::bindings {

namespace {

using runtime::Runtime;

// p2p_send(peer, tag, dtype_code, shape, data, wait_now=False) -> handle; data: an address or
// a buffer; wait_now: the caller waits for the handle at once (it drives it).
PyObject* pyP2pSend(PyObject*, PyObject* args) {
  int peer = 0, dtype = 0, wait_now = 0;
  long long tag = 0;
  PyObject *shape_obj = nullptr, *data_obj = nullptr;
  if (!PyArg_ParseTuple(args, "iLiOO|p", &peer, &tag, &dtype, &shape_obj, &data_obj,
                        &wait_now)) {
    return nullptr;
  }
  if (!common::isValidDataType(dtype)) {
    PyErr_Format(PyExc_TypeError, "send(to rank %d, tag %lld): unsupported dtype code %d", peer,
                 tag, dtype);
    return nullptr;
  }
  std::vector<int64_t> shape;
  if (!toInt64List(shape_obj, &shape, "send(): shape must be a sequence of ints")) return nullptr;
  uintptr_t address = 0;
  if (PyLong_Check(data_obj)) {
    address = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(data_obj));
    if (PyErr_Occurred()) return nullptr;
  } else {
    Py_buffer view;
    if (PyObject_GetBuffer(data_obj, &view, PyBUF_C_CONTIGUOUS) != 0) return nullptr;
    address = reinterpret_cast<uintptr_t>(view.buf);
    const Py_ssize_t have = view.len;
    PyBuffer_Release(&view);
    uint64_t need = 0;
    if (!transport::peerPayloadBytes(static_cast<common::DataType>(dtype), shape, &need) ||
        static_cast<uint64_t>(have) != need) {
      PyErr_Format(PyExc_ValueError,
                   "send(to rank %d, tag %lld): the buffer holds %zd bytes, its dtype and shape "
                   "need %llu", peer, tag, have, static_cast<unsigned long long>(need));
      return nullptr;
    }
  }
  int64_t handle = 0;
  common::Status status;
  // Without the GIL: an isend may write its frame here (Note [Caller drives] H), up to a
  // ring's worth of copying, or fail the rank. The caller's argument keeps `data` alive.
  Py_BEGIN_ALLOW_THREADS
  status = Runtime::instance().send(peer, tag, static_cast<common::DataType>(dtype),
                                    std::move(shape), reinterpret_cast<const void*>(address),
                                    wait_now != 0, &handle);
  Py_END_ALLOW_THREADS
  if (!status.isOk()) return raiseStatus(status);
  return PyLong_FromLongLong(handle);
}

// p2p_recv(peer, tag, wait_now=False) -> handle
PyObject* pyP2pRecv(PyObject*, PyObject* args) {
  int peer = 0, wait_now = 0;
  long long tag = 0;
  if (!PyArg_ParseTuple(args, "iL|p", &peer, &tag, &wait_now)) return nullptr;
  int64_t handle = 0;
  common::Status status;
  Py_BEGIN_ALLOW_THREADS  // an irecv may read rings here (Note [Caller drives] H)
  status = Runtime::instance().recv(peer, tag, wait_now != 0, &handle);
  Py_END_ALLOW_THREADS
  if (!status.isOk()) return raiseStatus(status);
  return PyLong_FromLongLong(handle);
}

PyMethodDef g_peer_methods[] = {
    {"p2p_send", pyP2pSend, METH_VARARGS,
     "p2p_send(peer, tag, dtype_code, shape, data, wait_now=False): queue a message to a "
     "rank; returns a handle (wait() returns None). data stays in use until then. wait_now: "
     "the caller waits for it at once."},
    {"p2p_recv", pyP2pRecv, METH_VARARGS,
     "p2p_recv(peer, tag, wait_now=False): receive the next message with this tag from a "
     "rank; returns a handle (wait() returns (Buffer, shape, dtype code))."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int addPeerBindings(PyObject* module) { return PyModule_AddFunctions(module, g_peer_methods); }

}  // namespace hvd::bindings
