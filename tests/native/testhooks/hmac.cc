// sha256, hmac_sha256, constant_time_equal (testhooks/hooks.h): common/hmac.h on bytes the
// tests choose, so its digests are checked against published vectors and Python's hashlib;
// both ends of the handshake share this code, so a consistent bug would otherwise go unseen.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>

#include "common/hmac.h"
#include "testhooks/hooks.h"

namespace hvd::testhooks {
namespace {

PyObject* digestBytes(const common::Digest& d) {
  return PyBytes_FromStringAndSize(reinterpret_cast<const char*>(d.data()),
                                   static_cast<Py_ssize_t>(d.size()));
}

// sha256(data: bytes, chunk: int = 0) -> 32 bytes. chunk > 0 feeds Sha256::update in pieces
// of that size (block boundaries inside and across calls).
PyObject* sha256(PyObject*, PyObject* args) {
  Py_buffer data;
  Py_ssize_t chunk = 0;
  if (!PyArg_ParseTuple(args, "y*|n", &data, &chunk)) return nullptr;
  common::Digest d;
  if (chunk <= 0) {
    d = common::sha256(data.buf, static_cast<size_t>(data.len));
  } else {
    common::Sha256 h;
    const auto* p = static_cast<const uint8_t*>(data.buf);
    for (Py_ssize_t at = 0; at < data.len; at += chunk) {
      h.update(p + at, static_cast<size_t>(std::min(chunk, data.len - at)));
    }
    d = h.finish();
  }
  PyBuffer_Release(&data);
  return digestBytes(d);
}

// hmac_sha256(key: bytes, data: bytes) -> 32 bytes.
PyObject* hmacSha256(PyObject*, PyObject* args) {
  Py_buffer key, data;
  if (!PyArg_ParseTuple(args, "y*y*", &key, &data)) return nullptr;
  const std::string k(static_cast<const char*>(key.buf), static_cast<size_t>(key.len));
  const common::Digest d = common::hmacSha256(k, data.buf, static_cast<size_t>(data.len));
  PyBuffer_Release(&key);
  PyBuffer_Release(&data);
  return digestBytes(d);
}

// constant_time_equal(a: bytes, b: bytes) -> bool (equal lengths required).
PyObject* constantTimeEqual(PyObject*, PyObject* args) {
  Py_buffer a, b;
  if (!PyArg_ParseTuple(args, "y*y*", &a, &b)) return nullptr;
  PyObject* result = nullptr;
  if (a.len != b.len) {
    PyErr_SetString(PyExc_ValueError, "constant_time_equal needs two buffers of one length");
  } else {
    result = PyBool_FromLong(common::constantTimeEqual(static_cast<const uint8_t*>(a.buf),
                                                       static_cast<const uint8_t*>(b.buf),
                                                       static_cast<size_t>(a.len)));
  }
  PyBuffer_Release(&a);
  PyBuffer_Release(&b);
  return result;
}

PyMethodDef g_methods[] = {
    {"sha256", sha256, METH_VARARGS, "common::sha256 / Sha256::update in chunks: 32 bytes"},
    {"hmac_sha256", hmacSha256, METH_VARARGS, "common::hmacSha256(key, data): 32 bytes"},
    {"constant_time_equal", constantTimeEqual, METH_VARARGS, "common::constantTimeEqual"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

int addHmacHooks(PyObject* module) { return PyModule_AddFunctions(module, g_methods); }

}  // namespace hvd::testhooks
