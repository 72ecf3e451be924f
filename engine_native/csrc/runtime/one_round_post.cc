// One-round board posts (runtime/one_round_post.h).
#include "runtime/one_round_post.h"

#include <cstring>
#include <limits>

#include "common/byte_codec.h"

namespace hvd::runtime::one_round {

using common::Status;

namespace {

constexpr size_t kParamsFixedBytes = 24;  // type, dtype, reduce op, dims, root, two f64
constexpr size_t kDataAlign = 16;

size_t padTo(size_t offset) { return (kDataAlign - offset % kDataAlign) % kDataAlign; }

void patchCount(std::string* out, uint32_t count) {
  std::string bytes;
  common::ByteWriter(&bytes).u32(count);
  out->replace(8, 4, bytes);
}

}  // namespace

void PostWriter::begin(uint64_t round) {
  out_.clear();
  common::ByteWriter w(&out_);
  w.u64(round);
  w.u32(0);
  count_ = 0;
}

bool PostWriter::addData(std::string_view name, const coord::Request& request, const void* data,
                         size_t bytes, size_t capacity) {
  const size_t dims = request.shape.size();
  const size_t splits = request.type == coord::OpType::kAlltoall ? request.splits.size() : 0;
  if (name.size() > kMaxPostedName || dims > kMaxPostedDims || splits > kMaxPostedSplits) {
    return false;
  }
  const size_t head = 1 + 2 + name.size() + kParamsFixedBytes + 8 * dims + 2 + 8 * splits + 4;
  const size_t pad = padTo(out_.size() + head);
  if (!fits(head + pad + bytes, capacity)) return false;
  common::ByteWriter w(&out_);
  w.u8(static_cast<uint8_t>(PostKind::kData));
  w.u16(static_cast<uint16_t>(name.size()));
  w.bytes(name.data(), name.size());
  w.u8(static_cast<uint8_t>(request.type));
  w.u8(static_cast<uint8_t>(request.dtype));
  w.u8(static_cast<uint8_t>(request.reduce_op));
  w.u8(static_cast<uint8_t>(dims));
  w.i32(request.root_rank);
  w.f64(request.prescale);
  w.f64(request.postscale);
  for (int64_t d : request.shape) w.i64(d);
  w.u16(static_cast<uint16_t>(splits));
  for (size_t i = 0; i < splits; ++i) w.i64(request.splits[i]);
  w.u32(static_cast<uint32_t>(bytes));
  out_.append(pad, '\0');
  last_data_ = out_.size();
  if (bytes > 0) w.bytes(data, bytes);
  ++count_;
  return true;
}

bool PostWriter::addNegotiate(std::string_view name, size_t capacity) {
  if (name.size() > kMaxPostedName || !fits(3 + name.size(), capacity)) return false;
  common::ByteWriter w(&out_);
  w.u8(static_cast<uint8_t>(PostKind::kNegotiate));
  w.u16(static_cast<uint16_t>(name.size()));
  w.bytes(name.data(), name.size());
  ++count_;
  return true;
}

const std::string& PostWriter::finish() {
  patchCount(&out_, count_);
  return out_;
}

namespace {

bool readParams(common::ByteReader& in, const uint8_t* slot, PostedOp* op) {
  uint8_t type = 0, dtype = 0, reduce = 0, dims = 0;
  if (!in.u8(&type) || !in.u8(&dtype) || !in.u8(&reduce) || !in.u8(&dims) ||
      !in.i32(&op->root_rank) || !in.f64(&op->prescale) || !in.f64(&op->postscale)) {
    return false;
  }
  if (type > static_cast<uint8_t>(coord::OpType::kReducescatter)) {
    return in.fail("op type " + std::to_string(type) + " has no data on the board");
  }
  if (!common::isValidDataType(dtype)) return in.fail("dtype " + std::to_string(dtype));
  if (reduce > static_cast<uint8_t>(common::ReduceOp::kProduct)) {
    return in.fail("reduce op " + std::to_string(reduce));
  }
  if (dims > kMaxPostedDims) return in.fail(std::to_string(dims) + " dims");
  op->type = static_cast<coord::OpType>(type);
  op->dtype = static_cast<common::DataType>(dtype);
  op->reduce_op = static_cast<common::ReduceOp>(reduce);
  const int64_t limit = std::numeric_limits<int64_t>::max() / 16;
  int64_t count = 1;
  op->dims = dims;
  op->shape = slot + in.position();
  for (uint8_t i = 0; i < dims; ++i) {
    int64_t d = 0;
    if (!in.i64(&d)) return false;
    if (d < 0 || (d > 0 && count > limit / d)) return in.fail("dim " + std::to_string(d));
    count *= d;
  }
  op->count = count;
  return true;
}

bool readSplits(common::ByteReader& in, const uint8_t* slot, PostedOp* op) {
  uint16_t splits = 0;
  if (!in.u16(&splits)) return false;
  if (splits > kMaxPostedSplits || (splits > 0 && op->type != coord::OpType::kAlltoall)) {
    return in.fail(std::to_string(splits) + " splits");
  }
  op->splits = splits;
  op->split_values = slot + in.position();
  return in.skip(8 * static_cast<size_t>(splits));
}

bool readOp(common::ByteReader& in, const uint8_t* slot, PostedOp* op) {
  uint8_t kind = 0;
  if (!in.u8(&kind)) return false;
  if (kind > static_cast<uint8_t>(PostKind::kNegotiate)) {
    return in.fail("post kind " + std::to_string(kind));
  }
  op->kind = static_cast<PostKind>(kind);
  uint16_t length = 0;
  if (!in.u16(&length)) return false;
  if (length > kMaxPostedName) return in.fail("name of " + std::to_string(length) + " bytes");
  if (!in.rawView(&op->name, length)) return false;
  if (op->kind == PostKind::kNegotiate) return true;
  const size_t params_at = in.position();
  if (!readParams(in, slot, op)) return false;
  op->params = std::string_view(reinterpret_cast<const char*>(slot) + params_at,
                                in.position() - params_at);
  if (!readSplits(in, slot, op)) return false;
  uint32_t bytes = 0;
  std::string_view pad;
  if (!in.u32(&bytes) || !in.rawView(&pad, padTo(in.position()))) return false;
  if (pad.find_first_not_of('\0') != std::string_view::npos) return in.fail("padding not zero");
  const size_t expected = static_cast<size_t>(op->count) * common::dataTypeSize(op->dtype);
  if (bytes != 0 && bytes != expected) {
    return in.fail(std::to_string(bytes) + " data bytes for " + std::to_string(expected));
  }
  op->bytes = bytes;
  op->data = bytes > 0 ? slot + in.position() : nullptr;
  return in.skip(bytes);
}

}  // namespace

int64_t PostedOp::readI64(const uint8_t* at, uint32_t i) {
  int64_t v = 0;
  common::ByteReader(at + 8 * static_cast<size_t>(i), 8).i64(&v);  // the decoder's bounds
  return v;
}

coord::Shape postedShape(const PostedOp& op) {
  coord::Shape shape;
  for (uint32_t i = 0; i < op.dims; ++i) shape.push_back(op.dim(i));
  return shape;
}

coord::Request postedRequest(const PostedOp& op) {
  coord::Request r;
  r.type = op.type;
  r.name = std::string(op.name);
  r.dtype = op.dtype;
  r.reduce_op = op.reduce_op;
  r.prescale = op.prescale;
  r.postscale = op.postscale;
  r.root_rank = op.root_rank;
  r.shape = postedShape(op);
  for (uint32_t i = 0; i < op.splits; ++i) r.splits.push_back(op.split(i));
  return r;
}

bool sameParams(const PostedOp& a, const PostedOp& b) {
  if (a.params.size() != b.params.size()) return false;
  const bool first_may_differ =
      a.type == coord::OpType::kAllgather || a.type == coord::OpType::kAlltoall;
  if (!first_may_differ || a.dims == 0) return a.params == b.params;
  constexpr size_t kDim0 = kParamsFixedBytes;  // dims start after the fixed part
  return a.params.substr(0, kDim0) == b.params.substr(0, kDim0) &&
         a.params.substr(kDim0 + 8) == b.params.substr(kDim0 + 8);
}

Status decodePost(const uint8_t* slot, size_t capacity, uint64_t round,
                  std::vector<PostedOp>* out) {
  common::ByteReader in(slot, capacity);
  uint64_t posted_round = 0;
  uint32_t count = 0;
  bool ok = in.u64(&posted_round) &&
            (posted_round == round ||
             in.fail("round " + std::to_string(posted_round) + " where " +
                     std::to_string(round) + " was due")) &&
            in.count(&count, 1);
  for (uint32_t i = 0; ok && i < count; ++i) {
    PostedOp op;
    ok = readOp(in, slot, &op);
    if (ok) out->push_back(op);
  }
  if (ok) return Status::ok();
  return common::internalError("malformed one-round post at byte " +
                               std::to_string(in.position()) + ": " + in.error());
}

}  // namespace hvd::runtime::one_round
