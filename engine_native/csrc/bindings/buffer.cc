// Binding code only: engine_native._core.Buffer, the core-owned output memory of allgather,
// alltoall and reducescatter. Host memory is exposed through the buffer protocol; CUDA memory
// (device >= 0) only by ptr and nbytes, which engine_native.torch wraps as a CUDA tensor.
// The object holds a reference to the memory, so it lives as long as any tensor over it.
#include "bindings/buffer.h"

#include <memory>

namespace hvd::bindings {
namespace {

struct BufferObject {
  PyObject_HEAD
  std::shared_ptr<hvd::runtime::OutputBuffer>* buffer;
};

void bufferDealloc(PyObject* self) {
  PyTypeObject* type = Py_TYPE(self);
  delete reinterpret_cast<BufferObject*>(self)->buffer;
  PyObject_Free(self);
  Py_DECREF(type);  // heap types own a reference from each instance
}

// Device memory is never exposed as a host buffer: reading it from the CPU would crash.
int bufferGet(PyObject* self, Py_buffer* view, int flags) {
  auto& buffer = *reinterpret_cast<BufferObject*>(self)->buffer;
  if (buffer->device >= 0) {
    PyErr_Format(PyExc_BufferError,
                 "this Buffer holds memory of CUDA device %d; wrap it with its ptr and nbytes "
                 "(__cuda_array_interface__), not as a host buffer", buffer->device);
    view->obj = nullptr;
    return -1;
  }
  return PyBuffer_FillInfo(view, self, buffer->data, static_cast<Py_ssize_t>(buffer->bytes), 0,
                           flags);
}

PyObject* bufferDevice(PyObject* self, void*) {
  return PyLong_FromLong((*reinterpret_cast<BufferObject*>(self)->buffer)->device);
}
PyObject* bufferPtr(PyObject* self, void*) {
  return PyLong_FromVoidPtr((*reinterpret_cast<BufferObject*>(self)->buffer)->data);
}
PyObject* bufferBytes(PyObject* self, void*) {
  return PyLong_FromSize_t((*reinterpret_cast<BufferObject*>(self)->buffer)->bytes);
}

PyObject* bufferReleaseStream(PyObject* self, void*) {
  return PyLong_FromUnsignedLongLong(
      (*reinterpret_cast<BufferObject*>(self)->buffer)->release_stream);
}
int setBufferReleaseStream(PyObject* self, PyObject* value, void*) {
  if (value == nullptr || !PyLong_Check(value)) {
    PyErr_SetString(PyExc_TypeError, "release_stream must be an int (a cudaStream_t)");
    return -1;
  }
  const unsigned long long stream = PyLong_AsUnsignedLongLong(value);
  if (PyErr_Occurred()) return -1;
  (*reinterpret_cast<BufferObject*>(self)->buffer)->release_stream = stream;
  return 0;
}

PyGetSetDef g_buffer_getset[] = {
    {"device", bufferDevice, nullptr, "CUDA ordinal of the memory, -1 for host memory", nullptr},
    {"release_stream", bufferReleaseStream, setBufferReleaseStream,
     "CUDA memory: the stream its users run on, set when a tensor is made over it (the "
     "memory is reused only after that stream got there once the tensor died); 0 is the "
     "legacy stream", nullptr},
    {"ptr", bufferPtr, nullptr, "address of the first byte", nullptr},
    {"nbytes", bufferBytes, nullptr, "size in bytes", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyType_Slot g_buffer_slots[] = {
    {Py_tp_dealloc, reinterpret_cast<void*>(bufferDealloc)},
    {Py_bf_getbuffer, reinterpret_cast<void*>(bufferGet)},
    {Py_tp_getset, g_buffer_getset},
    {Py_tp_doc, const_cast<char*>("Core-owned output memory: host memory through the buffer "
                                  "protocol, or CUDA memory (device >= 0) by ptr and nbytes.")},
    {0, nullptr}};

PyType_Spec g_buffer_spec = {"engine_native._core.Buffer", sizeof(BufferObject), 0,
                             Py_TPFLAGS_DEFAULT, g_buffer_slots};

PyTypeObject* g_buffer_type = nullptr;

}  // namespace

PyTypeObject* bufferType() {
  if (g_buffer_type == nullptr) {
    g_buffer_type = reinterpret_cast<PyTypeObject*>(PyType_FromSpec(&g_buffer_spec));
  }
  return g_buffer_type;
}

PyObject* wrapBuffer(const std::shared_ptr<hvd::runtime::OutputBuffer>& buffer) {
  auto* object = PyObject_New(BufferObject, g_buffer_type);
  if (object == nullptr) return nullptr;
  object->buffer = new std::shared_ptr<hvd::runtime::OutputBuffer>(buffer);
  return reinterpret_cast<PyObject*>(object);
}

}  // namespace hvd::bindings
