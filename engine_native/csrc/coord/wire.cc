#include "coord/wire.h"

#include <limits>

namespace hvd::coord::wire {

namespace {
// Element counts above this are rejected on decode, so that count x element size (<= 8 bytes)
// and sums of a few such products never overflow int64 in the coordinator.
constexpr int64_t kMaxElements = int64_t{1} << 56;
constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
}  // namespace

void writeRequest(common::ByteWriter& w, const Request& r, const std::string& name) {
  w.i32(r.request_rank);
  w.i32(static_cast<int32_t>(r.type));
  w.str(name);
  w.i32(static_cast<int32_t>(r.dtype));
  w.i64s(r.shape);
  w.i32(static_cast<int32_t>(r.reduce_op));
  w.f64(r.prescale);
  w.f64(r.postscale);
  w.i32(r.root_rank);
  w.i32(r.process_set);
  w.i32(r.group_id);
  w.i32(r.device);
  w.i64s(r.splits);
}

namespace {
bool checkElementCount(common::ByteReader& in, const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) return true;
    if (n > kMaxElements / d) return in.fail("tensor shape with too many elements");
    n *= d;
  }
  return true;
}
}  // namespace

bool readRequest(common::ByteReader& in, Request* out) {
  int32_t type = 0, dtype = 0, op = 0;
  bool ok = in.ranged(&out->request_rank, 0, kInt32Max, "request_rank") &&
            in.ranged(&type, 0, static_cast<int32_t>(OpType::kJoin), "op type") &&
            in.str(&out->name, kMaxNameBytes) &&
            in.ranged(&dtype, 0, common::kNumDataTypes - 1, "dtype") &&
            in.sizes(&out->shape) && checkElementCount(in, out->shape) &&
            in.ranged(&op, 0, static_cast<int32_t>(common::ReduceOp::kProduct), "reduce op") &&
            in.f64(&out->prescale) && in.f64(&out->postscale) &&
            in.ranged(&out->root_rank, 0, kInt32Max, "root rank") &&
            in.ranged(&out->process_set, 0, kInt32Max, "process set") &&
            in.ranged(&out->group_id, -1, kInt32Max, "group id") &&
            in.ranged(&out->device, -1, kInt32Max, "device") &&
            in.sizes(&out->splits);
  if (!ok) return false;
  out->type = static_cast<OpType>(type);
  out->dtype = static_cast<common::DataType>(dtype);
  out->reduce_op = static_cast<common::ReduceOp>(op);
  return true;
}

}  // namespace hvd::coord::wire
