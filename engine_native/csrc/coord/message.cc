// Encoding of ResponseList (rank 0 -> workers) and the plain RequestList entry points.
// Layout: u8 kResponseListTag, u32 count, then each Response's fields in declaration order
// (enums as i32, doubles as IEEE-754 bits, strings and vectors length-prefixed), then, only
// when the list carries tuned parameters, u8 kParamsTag and the ParamsUpdate fields; nothing
// after. A list without parameters encodes exactly as before the block existed.
// RequestList uses the format of request_cache.cc with no cache (every entry in full form).
#include "coord/message.h"

#include <cmath>
#include <limits>

#include "coord/response_cache.h"
#include "coord/wire.h"

namespace hvd::coord {

const char* opTypeName(OpType type) {
  switch (type) {
    case OpType::kAllreduce: return "ALLREDUCE";
    case OpType::kAllgather: return "ALLGATHER";
    case OpType::kBroadcast: return "BROADCAST";
    case OpType::kAlltoall: return "ALLTOALL";
    case OpType::kReducescatter: return "REDUCESCATTER";
    case OpType::kBarrier: return "BARRIER";
    case OpType::kJoin: return "JOIN";
  }
  return "UNKNOWN";
}

namespace {

constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
constexpr size_t kMinResponseBytes = 16;  // far below a real entry; bounds the count only
constexpr uint8_t kParamsTag = 0x50;      // 'P': a ParamsUpdate follows the responses
constexpr int64_t kMaxFusionBytes = int64_t{1} << 50;
constexpr double kMaxCycleMs = 1e6;
constexpr int32_t kMaxPhase = 3;          // autotune::AutotunePhase::kDone
constexpr int32_t kMaxTrials = 1 << 20;

void writeResponse(common::ByteWriter& w, const Response& r, const KeyTable& keys) {
  w.i32(static_cast<int32_t>(r.status));
  w.i32(static_cast<int32_t>(r.type));
  w.u32(static_cast<uint32_t>(r.keys.size()));
  for (Key key : r.keys) w.str(keys.name(key));
  w.str(r.error);
  w.i32(static_cast<int32_t>(r.dtype));
  w.i32(static_cast<int32_t>(r.reduce_op));
  w.f64(r.prescale);
  w.f64(r.postscale);
  w.i32(r.root_rank);
  w.i32(r.process_set);
  w.i32(r.device);
  w.i64s(r.counts);
  w.i64s(r.first_dims);
  w.i64s(r.row_shape);
  w.i64s(r.splits_matrix);
  w.i32(r.last_joined_rank);
}

bool readNames(common::ByteReader& in, std::vector<std::string_view>* names) {
  uint32_t n = 0;
  if (!in.count(&n, 4)) return false;
  names->clear();
  for (uint32_t i = 0; i < n; ++i) {
    std::string_view name;
    if (!in.str(&name, wire::kMaxNameBytes)) return false;
    names->push_back(name);
  }
  return true;
}

// Cross-field consistency a well-formed Response always has.
bool checkShape(common::ByteReader& in, const Response& r, size_t names, OpType type,
                ResponseType status) {
  if (!r.counts.empty() && r.counts.size() != names) {
    return in.fail("counts do not match names");
  }
  if (type == OpType::kAllgather && status == ResponseType::kOk && names > 0) {
    // Each count is at most the row dims sent, so their sum cannot overflow (a peer's
    // INT64_MAX counts once did: signed overflow, found by tests/fuzz).
    size_t dims = 0;
    for (int64_t c : r.counts) {
      if (static_cast<uint64_t>(c) > r.row_shape.size()) return in.fail("row dims out of range");
      dims += static_cast<size_t>(c);
    }
    if (r.counts.size() != names || dims != r.row_shape.size() ||
        r.first_dims.size() % names != 0) {
      return in.fail("allgather row shapes or first dims do not match names");
    }
  }
  size_t n = 0;
  while (n * n < r.splits_matrix.size()) ++n;
  if (n * n != r.splits_matrix.size()) return in.fail("splits matrix is not square");
  return true;
}

// Names are interned (in `batch`) once the response's process set is known.
bool readResponse(common::ByteReader& in, KeyTable::Batch& batch,
                  std::vector<std::string_view>* names, Response* out) {
  int32_t status = 0, type = 0, dtype = 0, op = 0;
  bool ok = in.ranged(&status, 0, static_cast<int32_t>(ResponseType::kError), "status") &&
            in.ranged(&type, 0, static_cast<int32_t>(OpType::kJoin), "op type") &&
            readNames(in, names) && in.str(&out->error, wire::kMaxErrorBytes) &&
            in.ranged(&dtype, 0, common::kNumDataTypes - 1, "dtype") &&
            in.ranged(&op, 0, static_cast<int32_t>(common::ReduceOp::kProduct), "reduce op") &&
            in.f64(&out->prescale) && in.f64(&out->postscale) &&
            in.ranged(&out->root_rank, 0, kInt32Max, "root rank") &&
            in.ranged(&out->process_set, 0, kInt32Max, "process set") &&
            in.ranged(&out->device, -1, kInt32Max, "device") &&
            in.sizes(&out->counts) && in.sizes(&out->first_dims) &&
            in.sizes(&out->row_shape) && in.sizes(&out->splits_matrix) &&
            in.ranged(&out->last_joined_rank, -1, kInt32Max, "last joined rank") &&
            checkShape(in, *out, names->size(), static_cast<OpType>(type),
                       static_cast<ResponseType>(status));
  if (!ok) return false;
  out->status = static_cast<ResponseType>(status);
  out->type = static_cast<OpType>(type);
  out->dtype = static_cast<common::DataType>(dtype);
  out->reduce_op = static_cast<common::ReduceOp>(op);
  out->keys.clear();
  out->keys.reserve(names->size());
  for (std::string_view name : *names) {
    Key key = batch.intern(out->process_set, name);
    if (!key.assigned()) return in.fail("more tensor names than the key table holds");
    out->keys.push_back(key);
  }
  return true;
}

void writeParams(common::ByteWriter& w, const ParamsUpdate& p) {
  w.u8(kParamsTag);
  w.i64(p.fusion_threshold_bytes);
  w.f64(p.cycle_time_ms);
  w.u8(p.cache_enabled ? 1 : 0);
  w.u8(p.hierarchical_allreduce ? 1 : 0);
  w.i32(p.phase);
  w.i32(p.trial);
  w.i32(p.trials);
}

bool readFlag(common::ByteReader& in, bool* v, const char* what) {
  uint8_t b = 0;
  if (!in.u8(&b)) return false;
  if (b > 1) return in.fail(std::string(what) + " flag " + std::to_string(b) + " is not 0 or 1");
  *v = b == 1;
  return true;
}

bool readParams(common::ByteReader& in, ParamsUpdate* out) {
  uint8_t tag = 0;
  bool ok = in.u8(&tag) && (tag == kParamsTag || in.fail("unknown block after the responses")) &&
            in.i64(&out->fusion_threshold_bytes) && in.f64(&out->cycle_time_ms) &&
            readFlag(in, &out->cache_enabled, "cache") &&
            readFlag(in, &out->hierarchical_allreduce, "hierarchical") &&
            in.ranged(&out->phase, 0, kMaxPhase, "autotune phase") &&
            in.ranged(&out->trial, 0, kMaxTrials, "autotune trial") &&
            in.ranged(&out->trials, 0, kMaxTrials, "autotune trials");
  if (!ok) return false;
  if (out->fusion_threshold_bytes < 0 || out->fusion_threshold_bytes > kMaxFusionBytes) {
    return in.fail("fusion threshold " + std::to_string(out->fusion_threshold_bytes) +
                   " out of range");
  }
  if (!std::isfinite(out->cycle_time_ms) || out->cycle_time_ms < 0 ||
      out->cycle_time_ms > kMaxCycleMs) {
    return in.fail("cycle time out of range");
  }
  return true;
}

}  // namespace

std::string encode(const Response* const* responses, size_t count,
                   const std::optional<ParamsUpdate>& params, const KeyTable& keys) {
  size_t names = 0;
  for (size_t i = 0; i < count; ++i) names += responses[i]->keys.size();
  std::string out;
  out.reserve(16 + 120 * count + 40 * names);
  common::ByteWriter w(&out);
  w.u8(wire::kResponseListTag);
  w.u32(static_cast<uint32_t>(count));
  for (size_t i = 0; i < count; ++i) writeResponse(w, *responses[i], keys);
  if (params) writeParams(w, *params);
  return out;
}

std::string encode(const ResponseList& list, const KeyTable& keys) {
  std::vector<const Response*> responses;
  for (const Response& r : list.responses) responses.push_back(&r);
  return encode(responses.data(), responses.size(), list.params, keys);
}

common::Status decode(const std::string& bytes, KeyTable& keys, ResponseList* out) {
  common::ByteReader in(bytes);
  uint8_t tag = 0;
  uint32_t n = 0;
  bool ok = in.u8(&tag) && (tag == wire::kResponseListTag || in.fail("not a ResponseList")) &&
            in.count(&n, kMinResponseBytes);
  std::vector<Response> responses;  // grown as entries parse: a lying count allocates nothing
  {
    KeyTable::Batch batch(keys);  // every name of the list under one lock
    std::vector<std::string_view> names;
    for (uint32_t i = 0; ok && i < n; ++i) {
      Response r;
      ok = readResponse(in, batch, &names, &r);
      if (ok) responses.push_back(std::move(r));
    }
  }
  std::optional<ParamsUpdate> params;
  if (ok && !in.atEnd()) {
    params.emplace();
    ok = readParams(in, &*params);
  }
  if (ok && !in.atEnd()) ok = in.fail("trailing bytes");
  if (!ok) return common::internalError("malformed ResponseList: " + in.error());
  out->responses = std::move(responses);
  out->params = params;
  return common::Status::ok();
}

std::string encode(const RequestList& list) {
  std::vector<const Request*> requests;
  for (const Request& r : list.requests) requests.push_back(&r);
  return encodeRequests(requests.data(), requests.size(), nullptr);
}

common::Status decode(const std::string& bytes, RequestList* out) {
  return decodeRequests(bytes, nullptr, out);
}

}  // namespace hvd::coord
