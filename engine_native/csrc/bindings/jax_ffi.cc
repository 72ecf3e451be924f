// engine_native.jax's collectives inside jax.jit as XLA FFI custom calls (issue #37): the handler
// XLA:CPU calls with the program's own buffers runs the core's op on them (no Python), where an
// ordered io_callback took the GIL, ran numpy_ops and copied operands and results.
// engine_native/jax/xla_ffi.py registers the targets xla_ffi_targets() returns and emits the
// calls; this file only decodes a call, enqueues it, waits and copies a gathered result out.
// Runs on XLA's threads, without the GIL (xla_ffi_targets() alone is called from Python).
//
// Note [FFI through the C API]
// The handler reads the call frame through xla/ffi/api/c_api.h only. jaxlib's C++ wrappers
// (api.h, ffi.h) include <iostream> and format their decoding errors with std::stringstream,
// which would put iostream symbols back into the core (Note [No iostreams in the core],
// common/text.h). So the handler answers XLA's metadata query itself (the API version of these
// headers, no traits), checks each argument, result and attribute by hand, and returns
// XLA_FFI_Error values made by the API's XLA_FFI_Error_Create.
//
// Note [FFI call layout]
// Operands: a token, then n arrays; results: a token, then n arrays of the operands' dtypes
// (alltoall: one array, then its received splits, int32 or int64). Allreduce and broadcast:
// result i has operand i's shape and the core reads operand i and writes result i. Allgather,
// reducescatter, alltoall: the core writes its own output buffer (the sizes are the ranks'),
// and the handler copies it into result i after checking that it has the traced shape, failing
// the op on each rank where it does not (a ragged allgather: the ranks traced other sizes).
// The token is JAX's ordered-effect token: it chains every collective of a program, so XLA runs
// them one after the other in program order on every rank (Note [Ordered FFI collectives] in
// xla_ffi.py). Attributes: op (coord::OpType), name (the full name, "<op>.<traced name>"),
// first (-1: one op named `name`; else a group named "<name>_<first + i>of<n>", as
// submitNamedGroup), reduce_op, prescale, postscale, root_rank, process_set.
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#if defined(__has_include)
#if __has_include("xla/ffi/api/c_api.h")
#define HVD_XLA_FFI 1  // setup.py adds jaxlib's include folder when jaxlib is installed
#endif
#endif

#ifdef HVD_XLA_FFI
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "bindings/core_calls.h"
#include "bindings/enqueue_args.h"
#include "bindings/group_core.h"
#include "bindings/jit_interrupt.h"
#include "common/dtype.h"
#include "common/text.h"
#include "runtime/runtime.h"
#include "xla/ffi/api/c_api.h"
#endif

namespace hvd::bindings {
namespace {

#ifdef HVD_XLA_FFI

XLA_FFI_Error* ffiError(const XLA_FFI_Api* api, XLA_FFI_Error_Code code,
                        const std::string& message) {
  XLA_FFI_Error_Create_Args args{};
  args.struct_size = XLA_FFI_Error_Create_Args_STRUCT_SIZE;
  args.message = message.c_str();  // copied into the error
  args.errc = code;
  return api->XLA_FFI_Error_Create(&args);
}

// What XLA asks before the first call (Note [FFI through the C API]).
XLA_FFI_Error* answerMetadata(XLA_FFI_CallFrame* frame) {
  auto* extension = reinterpret_cast<XLA_FFI_Metadata_Extension*>(frame->extension_start);
  if (extension->extension_base.struct_size < XLA_FFI_Metadata_Extension_STRUCT_SIZE ||
      extension->metadata->struct_size < XLA_FFI_Metadata_STRUCT_SIZE) {
    return ffiError(frame->api, XLA_FFI_Error_Code_INVALID_ARGUMENT,
                    "engine_native._core: XLA's FFI metadata query is older than jaxlib's "
                    "headers this core was built with; rebuild engine_native against this jaxlib");
  }
  extension->metadata->api_version = XLA_FFI_Api_Version{
      XLA_FFI_Api_Version_STRUCT_SIZE, nullptr, XLA_FFI_API_MAJOR, XLA_FFI_API_MINOR};
  extension->metadata->traits = 0;
  return nullptr;
}

bool coreDataType(XLA_FFI_DataType type, common::DataType* out) {
  using common::DataType;
  switch (type) {
    case XLA_FFI_DataType_U8: *out = DataType::kUint8; return true;
    case XLA_FFI_DataType_S8: *out = DataType::kInt8; return true;
    case XLA_FFI_DataType_S16: *out = DataType::kInt16; return true;
    case XLA_FFI_DataType_S32: *out = DataType::kInt32; return true;
    case XLA_FFI_DataType_S64: *out = DataType::kInt64; return true;
    case XLA_FFI_DataType_F16: *out = DataType::kFloat16; return true;
    case XLA_FFI_DataType_BF16: *out = DataType::kBfloat16; return true;
    case XLA_FFI_DataType_F32: *out = DataType::kFloat32; return true;
    case XLA_FFI_DataType_F64: *out = DataType::kFloat64; return true;
    case XLA_FFI_DataType_PRED: *out = DataType::kBool; return true;
    default: return false;
  }
}

// The call's attributes (Note [FFI call layout]); `missing` names the first one absent or of
// another type.
struct CallAttrs {
  int64_t op = -1, first = -1, reduce_op = 0, root_rank = 0, process_set = 0;
  double prescale = 1.0, postscale = 1.0;
  std::string name;
  std::string missing;
};

bool scalarInt(const XLA_FFI_Scalar* s, int64_t* out) {
  if (s->dtype == XLA_FFI_DataType_S64) *out = *static_cast<const int64_t*>(s->value);
  else if (s->dtype == XLA_FFI_DataType_S32) *out = *static_cast<const int32_t*>(s->value);
  else return false;
  return true;
}

bool scalarDouble(const XLA_FFI_Scalar* s, double* out) {
  if (s->dtype == XLA_FFI_DataType_F64) *out = *static_cast<const double*>(s->value);
  else if (s->dtype == XLA_FFI_DataType_F32) *out = *static_cast<const float*>(s->value);
  else return false;
  return true;
}

CallAttrs readAttrs(const XLA_FFI_Attrs& attrs) {
  CallAttrs a;
  struct Int { const char* key; int64_t* value; };
  const Int ints[] = {{"op", &a.op}, {"first", &a.first}, {"reduce_op", &a.reduce_op},
                      {"root_rank", &a.root_rank}, {"process_set", &a.process_set}};
  struct Real { const char* key; double* value; };
  const Real reals[] = {{"prescale", &a.prescale}, {"postscale", &a.postscale}};
  int found = 0;
  for (int64_t i = 0; i < attrs.size; ++i) {
    const std::string_view key(attrs.names[i]->ptr, attrs.names[i]->len);
    const XLA_FFI_AttrType type = attrs.types[i];
    const auto* scalar = static_cast<const XLA_FFI_Scalar*>(attrs.attrs[i]);
    bool ok = false;
    if (key == "name" && type == XLA_FFI_AttrType_STRING) {
      const auto* text = static_cast<const XLA_FFI_ByteSpan*>(attrs.attrs[i]);
      a.name.assign(text->ptr, text->len);
      ok = true;
    }
    for (const Int& want : ints) {
      if (key == want.key) ok = type == XLA_FFI_AttrType_SCALAR && scalarInt(scalar, want.value);
    }
    for (const Real& want : reals) {
      if (key == want.key) {
        ok = type == XLA_FFI_AttrType_SCALAR && scalarDouble(scalar, want.value);
      }
    }
    if (!ok && a.missing.empty()) a.missing = std::string(key) + " (of an unexpected type)";
    found += ok ? 1 : 0;
  }
  if (a.missing.empty() && found != 8) a.missing = "one of op, name, first, reduce_op, "
                                                   "prescale, postscale, root_rank, process_set";
  return a;
}

bool inPlace(int64_t op) {  // the core writes result i itself (Note [FFI call layout])
  return op == static_cast<int64_t>(coord::OpType::kAllreduce) ||
         op == static_cast<int64_t>(coord::OpType::kBroadcast);
}

std::string shapeText(const int64_t* dims, int64_t rank) {
  return common::tupleText(dims, static_cast<size_t>(rank));
}

// Operand 1 + i and result 1 + i as op i of the group, or an error message naming it.
std::string fillOp(const XLA_FFI_CallFrame* frame, const CallAttrs& a, int64_t i,
                   runtime::EnqueueArgs* op) {
  const std::string which = "array " + std::to_string(i);
  if (frame->args.types[1 + i] != XLA_FFI_ArgType_BUFFER ||
      frame->rets.types[1 + i] != XLA_FFI_RetType_BUFFER) {
    return which + " is not a buffer";
  }
  const auto* in = static_cast<const XLA_FFI_Buffer*>(frame->args.args[1 + i]);
  const auto* out = static_cast<const XLA_FFI_Buffer*>(frame->rets.rets[1 + i]);
  if (in->dtype != out->dtype || (inPlace(a.op) && (in->rank != out->rank ||
      (in->rank > 0 && std::memcmp(in->dims, out->dims, sizeof(int64_t) * in->rank) != 0)))) {
    return which + ": its result's dtype or shape differs from its operand's";
  }
  common::DataType dtype;
  if (!coreDataType(in->dtype, &dtype)) {
    return which + ": XLA dtype " + std::to_string(in->dtype) + " is not one the core has";
  }
  auto& r = op->request;
  r.dtype = dtype;
  r.shape.assign(in->dims, in->dims + in->rank);
  setReduction(&r, static_cast<coord::OpType>(a.op), static_cast<int>(a.reduce_op), a.prescale,
               a.postscale, static_cast<int32_t>(a.process_set));
  r.root_rank = static_cast<int32_t>(a.root_rank);
  op->input = in->data;
  op->output = inPlace(a.op) ? out->data : nullptr;  // else the core's buffer, copied below
  return {};
}

// Member i's result into result 1 + i when the core allocated it (allgather, reducescatter,
// alltoall), and alltoall's received splits into result 2; an error message when the ranks'
// shapes made it another size than traced (jit knows shapes when tracing only).
std::string copyOut(const XLA_FFI_CallFrame* frame, const CallAttrs& a, int64_t i,
                    const std::string& member, const runtime::OpResult& result) {
  const auto* out = static_cast<const XLA_FFI_Buffer*>(frame->rets.rets[1 + i]);
  const size_t bytes = result.buffer ? result.buffer->bytes : 0;
  common::DataType dtype = common::DataType::kUint8;
  coreDataType(out->dtype, &dtype);  // checked by fillOp: the operand's dtype
  size_t want = common::dataTypeSize(dtype);
  for (int64_t d = 0; d < out->rank; ++d) want *= static_cast<size_t>(out->dims[d]);
  const bool same = result.shape.size() == static_cast<size_t>(out->rank) && bytes == want &&
      std::equal(result.shape.begin(), result.shape.end(), out->dims);
  if (!same) {
    return "'" + member + "' came back with shape " +
           shapeText(result.shape.data(), static_cast<int64_t>(result.shape.size())) +
           ", traced as " + shapeText(out->dims, out->rank) + ": the ranks' first dimensions "
           "differ, and a jitted " + (a.op == 1 ? "allgather" : a.op == 3 ? "alltoall" :
           "reducescatter") + " needs the same shape on every rank: call it outside jit";
  }
  if (want > 0) std::memcpy(out->data, result.buffer->data, want);
  if (a.op != static_cast<int64_t>(coord::OpType::kAlltoall)) return {};
  const auto* splits = static_cast<const XLA_FFI_Buffer*>(frame->rets.rets[2]);
  const auto count = static_cast<int64_t>(result.received_splits.size());
  if (splits->rank != 1 || splits->dims[0] != count ||
      (splits->dtype != XLA_FFI_DataType_S32 && splits->dtype != XLA_FFI_DataType_S64)) {
    return "its received splits do not fit the traced int32/int64 vector";
  }
  for (size_t k = 0; k < result.received_splits.size(); ++k) {
    if (splits->dtype == XLA_FFI_DataType_S64) {
      static_cast<int64_t*>(splits->data)[k] = result.received_splits[k];
    } else {
      static_cast<int32_t*>(splits->data)[k] = static_cast<int32_t>(result.received_splits[k]);
    }
  }
  return {};
}

// Every member waited for (each wait frees its name, Note [Handle lifetime]) and its result
// copied out where the core allocated it; the first failure's message (with what to do when
// the core stays failed), or empty. A Ctrl-C aborts the wait (Note [Ctrl-C inside jax.jit]).
std::string waitAll(const XLA_FFI_CallFrame* frame, const CallAttrs& a,
                    const std::vector<int64_t>& handles) {
  std::string failure;
  for (size_t i = 0; i < handles.size(); ++i) {
    common::Status status;
    runtime::OpResult result;
    awaitResult(handles[i], &status, &result, a.name);
    const std::string member = a.first < 0 ? a.name : a.name + "_" +
        std::to_string(a.first + static_cast<int64_t>(i)) + "of" + std::to_string(handles.size());
    std::string bad = !status.isOk() ? withNextStep(status)
        : inPlace(a.op) ? std::string()
                        : copyOut(frame, a, static_cast<int64_t>(i), member, result);
    if (!bad.empty() && failure.empty()) failure = std::move(bad);
  }
  return failure;
}

// Note [FFI call layout]; the one handler of every target xla_ffi_targets() names.
XLA_FFI_Error* runCollective(XLA_FFI_CallFrame* frame) {
  if (frame->extension_start != nullptr &&
      frame->extension_start->type == XLA_FFI_Extension_Metadata) {
    return answerMetadata(frame);
  }
  const XLA_FFI_Api* api = frame->api;
  const CallAttrs a = readAttrs(frame->attrs);
  const std::string what = "engine_native.jax " + (a.name.empty() ? "collective" : a.name);
  auto fail = [api, &what](XLA_FFI_Error_Code code, const std::string& why) {
    return ffiError(api, code, what + " inside jax.jit: " + why);
  };
  if (frame->stage != XLA_FFI_ExecutionStage_EXECUTE) {
    return fail(XLA_FFI_Error_Code_INTERNAL, "called at another stage than execute");
  }
  if (!a.missing.empty()) return fail(XLA_FFI_Error_Code_INVALID_ARGUMENT, "bad attribute " +
                                      a.missing);
  if (a.op < 0 || a.op > static_cast<int64_t>(coord::OpType::kReducescatter)) {
    return fail(XLA_FFI_Error_Code_INVALID_ARGUMENT, "op " + std::to_string(a.op) +
                " is not one this handler runs (allreduce, allgather, broadcast, alltoall, "
                "reducescatter)");
  }
  const bool alltoall = a.op == static_cast<int64_t>(coord::OpType::kAlltoall);
  const int64_t n = frame->args.size - 1;
  const auto* token_in = frame->args.size > 0
      ? static_cast<const XLA_FFI_Buffer*>(frame->args.args[0]) : nullptr;
  const auto* token_out = frame->rets.size > 0
      ? static_cast<const XLA_FFI_Buffer*>(frame->rets.rets[0]) : nullptr;
  const int64_t rets = frame->args.size + (alltoall ? 1 : 0);
  if (n < 1 || (alltoall && n != 1) || frame->rets.size != rets ||
      token_in->dtype != XLA_FFI_DataType_TOKEN || token_out->dtype != XLA_FFI_DataType_TOKEN) {
    return fail(XLA_FFI_Error_Code_INVALID_ARGUMENT,
                "expected a token and n >= 1 arrays in, a token and n arrays out (alltoall: "
                "one array in, it and its splits out); got " + std::to_string(frame->args.size) +
                " operands and " + std::to_string(frame->rets.size) + " results");
  }
  if (!runtime::Runtime::instance().initialized()) {
    return fail(XLA_FFI_Error_Code_FAILED_PRECONDITION, "the core is not initialized (call "
                "hvd.init() first, and run the jitted function before hvd.shutdown())");
  }
  std::vector<runtime::EnqueueArgs> ops(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const std::string bad = fillOp(frame, a, i, &ops[static_cast<size_t>(i)]);
    if (!bad.empty()) return fail(XLA_FFI_Error_Code_INVALID_ARGUMENT, bad);
  }
  std::vector<int64_t> handles;
  const common::Status status = enqueueNamedGroup(std::move(ops), a.name,
                                                  static_cast<int>(a.first), true, &handles);
  if (!status.isOk()) {  // this rank's argument, or the core's earlier failure
    const bool local = status.code() == common::Code::kInvalidArgument ||
                       status.code() == common::Code::kTypeError;
    return fail(local ? XLA_FFI_Error_Code_INVALID_ARGUMENT : XLA_FFI_Error_Code_ABORTED,
                withNextStep(status));
  }
  const std::string failure = waitAll(frame, a, handles);
  if (!failure.empty()) return fail(XLA_FFI_Error_Code_ABORTED, failure);
  return nullptr;
}

// xla_ffi_targets() -> {target name: capsule of its XLA_FFI_Handler*}, for
// jax.ffi.register_ffi_target(name, capsule, platform="cpu"); {} when the core was built
// without jaxlib's headers.
PyObject* pyXlaFfiTargets(PyObject*, PyObject*) {
  PyObject* targets = PyDict_New();
  PyObject* capsule = targets != nullptr ? PyCapsule_New(
      reinterpret_cast<void*>(&runCollective), nullptr, nullptr) : nullptr;
  if (capsule == nullptr || PyDict_SetItemString(targets, "hvd_collective", capsule) < 0) {
    Py_XDECREF(capsule);
    Py_XDECREF(targets);
    return nullptr;
  }
  Py_DECREF(capsule);
  return targets;
}

#else  // built without jaxlib's headers: jit keeps the ordered io_callback path

PyObject* pyXlaFfiTargets(PyObject*, PyObject*) { return PyDict_New(); }

#endif

PyMethodDef g_ffi_methods[] = {
    {"xla_ffi_targets", pyXlaFfiTargets, METH_NOARGS,
     "xla_ffi_targets(): {name: PyCapsule} of the XLA FFI handlers engine_native.jax registers "
     "for its collectives inside jax.jit; {} when the core was built without jaxlib's headers "
     "(then those collectives are ordered io_callbacks)."},
    {nullptr, nullptr, 0, nullptr}};

}  // namespace

int addJaxFfiBindings(PyObject* module) { return PyModule_AddFunctions(module, g_ffi_methods); }

}  // namespace hvd::bindings
