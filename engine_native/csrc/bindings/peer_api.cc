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

// The memory a message is read from (a send) or written to (a receive: `writable`): `obj` is
// an address (an int; not a bool) or a C-contiguous buffer of exactly `bytes`. False with a
// Python error naming the op ("recv(from rank 1, tag 5): into ...") otherwise; the text is
// made only then (a small message's call is a few microseconds). The buffer is not held: the
// caller keeps `obj` alive and unchanged until the handle completes.
bool messageMemory(PyObject* obj, bool writable, uint64_t bytes, int peer, long long tag,
                   uintptr_t* address) {
  const char* op = writable ? "recv(from" : "send(to";
  const char* role = writable ? "into" : "the buffer";
  if (PyBool_Check(obj)) {
    PyErr_Format(PyExc_TypeError, "%s rank %d, tag %lld): %s is a bool; pass an address (an "
                 "int) or a buffer", op, peer, tag, role);
    return false;
  }
  if (PyLong_Check(obj)) {
    *address = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(obj));
    if (PyErr_Occurred()) return false;
    if (*address == 0 && writable) {
      PyErr_Format(PyExc_ValueError, "%s rank %d, tag %lld): %s is a null address", op, peer,
                   tag, role);
      return false;
    }
    return true;
  }
  Py_buffer view;
  const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
  if (PyObject_GetBuffer(obj, &view, flags) != 0) return false;
  *address = reinterpret_cast<uintptr_t>(view.buf);
  const Py_ssize_t have = view.len;
  PyBuffer_Release(&view);
  if (static_cast<uint64_t>(have) != bytes || (writable && *address == 0)) {
    PyErr_Format(PyExc_ValueError, "%s rank %d, tag %lld): %s holds %zd bytes, its dtype and "
                 "shape need %llu", op, peer, tag, role, have,
                 static_cast<unsigned long long>(bytes));
    return false;
  }
  return true;
}

// p2p_send(peer, tag, dtype_code, shape, data, wait_now=False, device=-1, stream=0) ->
// handle; data: an address or a buffer (device >= 0: the address of a CUDA tensor on that
// device, produced on `stream`); wait_now: the caller waits for the handle at once (it drives
// it).
PyObject* pyP2pSend(PyObject*, PyObject* args) {
  int peer = 0, dtype = 0, wait_now = 0, device = -1;
  long long tag = 0;
  unsigned long long stream = 0;
  PyObject *shape_obj = nullptr, *data_obj = nullptr;
  if (!PyArg_ParseTuple(args, "iLiOO|piK", &peer, &tag, &dtype, &shape_obj, &data_obj,
                        &wait_now, &device, &stream)) {
    return nullptr;
  }
  if (!common::isValidDataType(dtype)) {
    PyErr_Format(PyExc_TypeError, "send(to rank %d, tag %lld): unsupported dtype code %d", peer,
                 tag, dtype);
    return nullptr;
  }
  std::vector<int64_t> shape;
  if (!toInt64List(shape_obj, &shape, "send(): shape must be a sequence of ints")) return nullptr;
  if (device >= 0 && !PyLong_Check(data_obj)) {
    PyErr_SetString(PyExc_TypeError, "send(): a CUDA tensor is passed by its address (an int)");
    return nullptr;
  }
  uint64_t need = 0;
  if (!transport::peerPayloadBytes(static_cast<common::DataType>(dtype), shape, &need)) {
    PyErr_Format(PyExc_ValueError, "send(to rank %d, tag %lld): bad shape", peer, tag);
    return nullptr;
  }
  uintptr_t address = 0;
  if (!messageMemory(data_obj, /*writable=*/false, need, peer, tag, &address)) return nullptr;
  int64_t handle = 0;
  common::Status status;
  // Without the GIL: an isend may write its frame here (Note [Caller drives] H), up to a
  // ring's worth of copying, or fail the rank. The caller's argument keeps `data` alive.
  runtime::PeerSend send;
  send.peer = peer;
  send.tag = tag;
  send.dtype = static_cast<common::DataType>(dtype);
  send.shape = std::move(shape);
  send.data = reinterpret_cast<const void*>(address);
  send.device = device;
  send.stream = static_cast<uintptr_t>(stream);
  Py_BEGIN_ALLOW_THREADS
  status = Runtime::instance().send(std::move(send), wait_now != 0, &handle);
  Py_END_ALLOW_THREADS
  if (!status.isOk()) return raiseStatus(status);
  return PyLong_FromLongLong(handle);
}

// p2p_recv(peer, tag, wait_now=False, device=-1, on_device=False, into=None, into_dtype=0,
// into_shape=()) -> handle; device: the CUDA device that reads a CUDA tensor sent from this
// host (its result stays there when on_device, else it lands in host memory); into: host
// memory of into_dtype x into_shape (C order; an address, or a writable buffer) that a message
// of exactly that type is written to (Note [Receive into out]; wait() then gives None for the
// buffer); the caller keeps it alive until the handle completes. into=None with into_shape:
// the caller fills an out= of that type itself. Either way a message of another type is
// refused: its sender raises too (Note [Refused messages]). consumer (>= 0, with on_device):
// the cudaStream_t that waits for a CUDA tensor's copy onto `device`, the receive completing
// once that copy is queued (Note [Device point-to-point] I).
PyObject* pyP2pRecv(PyObject*, PyObject* args) {
  int peer = 0, wait_now = 0, device = -1, on_device = 0, into_dtype = 0;
  long long tag = 0, consumer = -1;
  PyObject *into = Py_None, *into_shape = nullptr;
  if (!PyArg_ParseTuple(args, "iL|pipOiOL", &peer, &tag, &wait_now, &device, &on_device, &into,
                        &into_dtype, &into_shape, &consumer)) {
    return nullptr;
  }
  runtime::PeerRecv recv;
  recv.peer = peer;
  recv.tag = tag;
  recv.device = device;
  recv.on_device = on_device != 0;
  recv.consumer = consumer;
  if (consumer >= 0 && wait_now == 0) {  // Note [Device point-to-point] I
    PyErr_Format(PyExc_ValueError, "recv(from rank %d, tag %lld): consumer= needs wait_now: the "
                 "core queues the stream's wait while its caller waits", peer, tag);
    return nullptr;
  }
  // into=None with into_shape: an out= the core cannot write, whose type it still checks
  recv.expects = into != Py_None || (into_shape != nullptr && into_shape != Py_None);
  if (recv.expects) {
    if (!common::isValidDataType(into_dtype)) {
      PyErr_Format(PyExc_TypeError, "recv(from rank %d, tag %lld): unsupported dtype code %d",
                   peer, tag, into_dtype);
      return nullptr;
    }
    if (into_shape == nullptr) {
      PyErr_SetString(PyExc_TypeError, "recv(): into needs into_shape");
      return nullptr;
    }
    if (!toInt64List(into_shape, &recv.into_shape, "recv(): into_shape must be a sequence of "
                     "ints")) {
      return nullptr;
    }
    uint64_t bytes = 0;
    recv.into_dtype = static_cast<common::DataType>(into_dtype);
    if (!transport::peerPayloadBytes(recv.into_dtype, recv.into_shape, &bytes)) {
      PyErr_Format(PyExc_ValueError, "recv(from rank %d, tag %lld): bad into_shape", peer, tag);
      return nullptr;
    }
    uintptr_t address = 0;
    if (into != Py_None &&
        !messageMemory(into, /*writable=*/true, bytes, peer, tag, &address)) {
      return nullptr;
    }
    recv.into = reinterpret_cast<uint8_t*>(address);
  }
  int64_t handle = 0;
  common::Status status;
  Py_BEGIN_ALLOW_THREADS  // an irecv may read rings here (Note [Caller drives] H)
  status = Runtime::instance().recv(recv, wait_now != 0, &handle);
  Py_END_ALLOW_THREADS
  if (!status.isOk()) return raiseStatus(status);
  return PyLong_FromLongLong(handle);
}

// p2p_cuda_route(peer) -> "nccl", "ipc", "staged" or "" (no channel to it)
PyObject* pyP2pCudaRoute(PyObject*, PyObject* args) {
  int peer = 0;
  if (!PyArg_ParseTuple(args, "i", &peer)) return nullptr;
  return PyUnicode_FromString(Runtime::instance().peerCudaRoute(peer).c_str());
}

PyMethodDef g_peer_methods[] = {
    {"p2p_send", pyP2pSend, METH_VARARGS,
     "p2p_send(peer, tag, dtype_code, shape, data, wait_now=False, device=-1, stream=0): queue "
     "a message to a rank; returns a handle (wait() returns None). data stays in use until "
     "then. wait_now: the caller waits for it at once. device >= 0: data is the address of a "
     "CUDA tensor on it, produced on stream (p2p_cuda_route 'nccl' or 'ipc' only)."},
    {"p2p_recv", pyP2pRecv, METH_VARARGS,
     "p2p_recv(peer, tag, wait_now=False, device=-1, on_device=False, into=None, into_dtype=0, "
     "into_shape=(), consumer=-1): receive the next message with this tag from a rank; returns "
     "a handle (wait() returns (Buffer, shape, dtype code)). device: the CUDA device that "
     "reads a CUDA tensor; on_device: its result stays there. into: host memory (an address or "
     "a writable buffer) of into_dtype x into_shape that a message of that type is written to "
     "(wait() then gives None for the Buffer); kept alive by the caller until the handle "
     "completes. "
     "into=None with into_shape: an out= the caller fills. A message of another type than "
     "into_dtype x into_shape is refused: its sender's op raises ValueError too. consumer "
     "(>= 0, with on_device): the cudaStream_t that waits for a CUDA tensor's copy by IPC "
     "(or its ncclRecv, once the pair's communicator is set up, on the device that receives "
     "from that rank); the receive completes once that is queued, else once the bytes are "
     "there."},
    {"p2p_cuda_route", pyP2pCudaRoute, METH_VARARGS,
     "p2p_cuda_route(peer): how a CUDA tensor travels to that rank: 'nccl' (ncclSend/ncclRecv: "
     "another host, or HVD_GPU_PATH=nccl), 'ipc' (CUDA IPC, a rank of this host), 'staged' "
     "(through host memory, by the binding), '' for no channel."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int addPeerBindings(PyObject* module) { return PyModule_AddFunctions(module, g_peer_methods); }

}  // namespace hvd::bindings
