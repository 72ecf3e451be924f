// codec_write, codec_read, sample_requests, sample_responses, decode_requests,
// decode_responses, field_text (testhooks/hooks.h): common/byte_codec.h on bytes the tests choose, checked
// against Python's struct, and the negotiation decoders (coord/message.h) fed truncated and
// mutated lists, as a peer's bytes would arrive: every one must come back as an error or a
// list, never a read past the end.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "common/byte_codec.h"
#include "common/text.h"
#include "coord/key_table.h"
#include "coord/message.h"
#include "testhooks/hooks.h"

namespace hvd::testhooks {
namespace {

// Field codes, as Python's struct: B u8, H u16, I u32, i i32, Q u64, q i64, d f64; s a
// u32-length-prefixed string (bytes, at most 64 KiB); z a vector of sizes (list of ints >= 0).
constexpr uint32_t kMaxString = 64 * 1024;

PyObject* bytesOf(const std::string& s) {
  return PyBytes_FromStringAndSize(s.data(), static_cast<Py_ssize_t>(s.size()));
}

// codec_write(fields: str, values: sequence) -> bytes.
PyObject* codecWrite(PyObject*, PyObject* args) {
  const char* fields = nullptr;
  PyObject* values = nullptr;
  if (!PyArg_ParseTuple(args, "sO", &fields, &values)) return nullptr;
  PyObject* fast = PySequence_Fast(values, "codec_write: values must be a sequence");
  if (fast == nullptr) return nullptr;
  std::string out;
  common::ByteWriter w(&out);
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(fast);
  if (static_cast<Py_ssize_t>(std::strlen(fields)) != n) {
    Py_DECREF(fast);
    return PyErr_Format(PyExc_ValueError, "codec_write: %zd values for %zd fields", n,
                        static_cast<Py_ssize_t>(std::strlen(fields)));
  }
  for (Py_ssize_t i = 0; fields[i] != '\0' && i < n && !PyErr_Occurred(); ++i) {
    PyObject* v = PySequence_Fast_GET_ITEM(fast, i);
    switch (fields[i]) {
      case 'B': w.u8(static_cast<uint8_t>(PyLong_AsUnsignedLongLongMask(v))); break;
      case 'H': w.u16(static_cast<uint16_t>(PyLong_AsUnsignedLongLongMask(v))); break;
      case 'I': w.u32(static_cast<uint32_t>(PyLong_AsUnsignedLongLongMask(v))); break;
      case 'i': w.i32(static_cast<int32_t>(PyLong_AsLongLong(v))); break;
      case 'Q': w.u64(PyLong_AsUnsignedLongLongMask(v)); break;
      case 'q': w.i64(PyLong_AsLongLong(v)); break;
      case 'd': w.f64(PyFloat_AsDouble(v)); break;
      case 's': {
        char* data = nullptr;
        Py_ssize_t len = 0;
        if (PyBytes_AsStringAndSize(v, &data, &len) == 0) {
          w.str(std::string(data, static_cast<size_t>(len)));
        }
        break;
      }
      case 'z': {
        std::vector<int64_t> sizes;
        PyObject* items = PySequence_Fast(v, "codec_write: z needs a list of ints");
        if (items == nullptr) break;
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(items); ++k) {
          sizes.push_back(PyLong_AsLongLong(PySequence_Fast_GET_ITEM(items, k)));
        }
        Py_DECREF(items);
        w.i64s(sizes);
        break;
      }
      default: PyErr_Format(PyExc_ValueError, "codec_write: unknown field '%c'", fields[i]);
    }
  }
  Py_DECREF(fast);
  return PyErr_Occurred() ? nullptr : bytesOf(out);
}

// One field read by `in`, as a new reference; nullptr (no exception) when the read failed.
PyObject* readField(common::ByteReader& in, char field) {
  uint8_t b = 0;
  uint16_t h = 0;
  uint32_t u = 0;
  int32_t i = 0;
  uint64_t q = 0;
  int64_t s = 0;
  double d = 0;
  std::string text;
  std::vector<int64_t> sizes;
  switch (field) {
    case 'B': return in.u8(&b) ? PyLong_FromUnsignedLong(b) : nullptr;
    case 'H': return in.u16(&h) ? PyLong_FromUnsignedLong(h) : nullptr;
    case 'I': return in.u32(&u) ? PyLong_FromUnsignedLong(u) : nullptr;
    case 'i': return in.i32(&i) ? PyLong_FromLong(i) : nullptr;
    case 'Q': return in.u64(&q) ? PyLong_FromUnsignedLongLong(q) : nullptr;
    case 'q': return in.i64(&s) ? PyLong_FromLongLong(s) : nullptr;
    case 'd': return in.f64(&d) ? PyFloat_FromDouble(d) : nullptr;
    case 's': return in.str(&text, kMaxString) ? bytesOf(text) : nullptr;
    case 'z': {
      if (!in.sizes(&sizes)) return nullptr;
      PyObject* list = PyList_New(static_cast<Py_ssize_t>(sizes.size()));
      for (size_t k = 0; list != nullptr && k < sizes.size(); ++k) {
        PyList_SET_ITEM(list, static_cast<Py_ssize_t>(k), PyLong_FromLongLong(sizes[k]));
      }
      return list;
    }
    default: return PyErr_Format(PyExc_ValueError, "codec_read: unknown field '%c'", field);
  }
}

// codec_read(data: bytes, fields: str) -> (values: list, error: str | None). Reading stops at
// the first failure; values holds what was read before it.
PyObject* codecRead(PyObject*, PyObject* args) {
  Py_buffer data;
  const char* fields = nullptr;
  if (!PyArg_ParseTuple(args, "y*s", &data, &fields)) return nullptr;
  common::ByteReader in(data.buf, static_cast<size_t>(data.len));
  PyObject* values = PyList_New(0);
  for (const char* f = fields; values != nullptr && *f != '\0'; ++f) {
    PyObject* v = readField(in, *f);
    if (v == nullptr) {
      if (PyErr_Occurred()) Py_CLEAR(values);
      break;
    }
    PyList_Append(values, v);
    Py_DECREF(v);
  }
  PyBuffer_Release(&data);
  if (values == nullptr) return nullptr;
  if (in.error().empty()) return Py_BuildValue("(NO)", values, Py_None);
  return Py_BuildValue("(Ns)", values, in.error().c_str());
}

coord::Request sampleRequest(const char* name, int32_t rank) {
  coord::Request r;
  r.request_rank = rank;
  r.type = coord::OpType::kAlltoall;
  r.name = name;
  r.shape = {4, 3};
  r.prescale = 0.5;
  r.splits = {1, 3};
  return r;
}

// sample_requests() -> bytes: a two-entry RequestList, every entry in full form.
PyObject* sampleRequests(PyObject*, PyObject*) {
  coord::RequestList list;
  list.requests = {sampleRequest("grad.fc1.weight", 1), sampleRequest("grad.fc1.bias", 1)};
  return bytesOf(coord::encode(list));
}

// sample_responses(with_params: bool) -> bytes: a fused allreduce and an allgather.
PyObject* sampleResponses(PyObject*, PyObject* args) {
  int with_params = 0;
  if (!PyArg_ParseTuple(args, "p", &with_params)) return nullptr;
  coord::KeyTable keys;
  coord::ResponseList list;
  coord::Response fused;
  fused.keys = {keys.intern(0, "a"), keys.intern(0, "b")};
  fused.counts = {6, 2};
  coord::Response gathered;
  gathered.type = coord::OpType::kAllgather;
  gathered.keys = {keys.intern(0, "c")};
  gathered.counts = {1};
  gathered.first_dims = {2, 5};
  gathered.row_shape = {3};
  list.responses = {fused, gathered};
  if (with_params) list.params = coord::ParamsUpdate{64 << 20, 2.5, true, false, 1, 3, 10};
  return bytesOf(coord::encode(list, keys));
}

// decode_requests(data) / decode_responses(data) -> None when the list decodes, else the
// error text.
PyObject* decodeResult(const common::Status& status) {
  if (status.isOk()) Py_RETURN_NONE;
  return PyUnicode_FromString(status.message().c_str());
}

bool bytesArg(PyObject* args, std::string* out) {
  Py_buffer data;
  if (!PyArg_ParseTuple(args, "y*", &data)) return false;
  out->assign(static_cast<const char*>(data.buf), static_cast<size_t>(data.len));
  PyBuffer_Release(&data);
  return true;
}

PyObject* decodeRequests(PyObject*, PyObject* args) {
  std::string bytes;
  if (!bytesArg(args, &bytes)) return nullptr;
  coord::RequestList list;
  return decodeResult(coord::decode(bytes, &list));
}

PyObject* decodeResponses(PyObject*, PyObject* args) {
  std::string bytes;
  if (!bytesArg(args, &bytes)) return nullptr;
  coord::KeyTable keys;
  coord::ResponseList list;
  return decodeResult(coord::decode(bytes, keys, &list));
}

// field_text(bytes) -> bytes: common::fieldText over a 16-byte field holding the first 16
// bytes given (zero-padded), with 16 bytes of 'Z' right after it in one record, as a peer's
// fixed-size text field arrives: a read past the field would return the Zs.
PyObject* fieldText(PyObject*, PyObject* args) {
  std::string bytes;
  if (!bytesArg(args, &bytes)) return nullptr;
  struct {
    char field[16];
    char after[16];
  } record{};
  std::memcpy(record.field, bytes.data(), std::min(bytes.size(), sizeof(record.field)));
  std::memset(record.after, 'Z', sizeof(record.after));
  return bytesOf(common::fieldText(record.field));
}

PyMethodDef g_methods[] = {
    {"codec_write", codecWrite, METH_VARARGS, "common::ByteWriter over struct-like fields"},
    {"codec_read", codecRead, METH_VARARGS, "common::ByteReader: (values, error or None)"},
    {"sample_requests", sampleRequests, METH_NOARGS, "an encoded two-entry RequestList"},
    {"sample_responses", sampleResponses, METH_VARARGS, "an encoded two-entry ResponseList"},
    {"decode_requests", decodeRequests, METH_VARARGS, "coord::decode(RequestList): error"},
    {"decode_responses", decodeResponses, METH_VARARGS, "coord::decode(ResponseList): error"},
    {"field_text", fieldText, METH_VARARGS, "common::fieldText of a 16-byte field"},
    {nullptr, nullptr, 0, nullptr},
};

}  // namespace

int addByteCodecHooks(PyObject* module) { return PyModule_AddFunctions(module, g_methods); }

}  // namespace hvd::testhooks
