#include "coord/wire.h"

#include <cstring>
#include <limits>

namespace hvd::coord::wire {

namespace {
// Element counts above this are rejected on decode, so that count x element size (<= 8 bytes)
// and sums of a few such products never overflow int64 in the coordinator.
constexpr int64_t kMaxElements = int64_t{1} << 56;
constexpr int32_t kInt32Max = std::numeric_limits<int32_t>::max();
}  // namespace

void ByteWriter::u32(uint32_t v) {
  char bytes[4];
  for (int i = 0; i < 4; ++i) bytes[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out_.append(bytes, 4);
}

void ByteWriter::u64(uint64_t v) {
  char bytes[8];
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out_.append(bytes, 8);
}

void ByteWriter::f64(double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  u64(bits);
}

void ByteWriter::str(const std::string& s) {
  u32(static_cast<uint32_t>(s.size()));
  out_.append(s);
}

void ByteWriter::i64s(const int64_t* v, size_t n) {
  u32(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) i64(v[i]);
}

bool ByteReader::fail(const std::string& what) {
  if (error_.empty()) error_ = what + " at byte " + std::to_string(pos_);
  return false;
}

bool ByteReader::take(size_t n, const char** p) {
  if (!error_.empty()) return false;
  if (n > size_ - pos_) return fail("truncated input (" + std::to_string(n) + " bytes needed)");
  *p = data_ + pos_;
  pos_ += n;
  return true;
}

bool ByteReader::u8(uint8_t* v) {
  const char* p = nullptr;
  if (!take(1, &p)) return false;
  *v = static_cast<uint8_t>(p[0]);
  return true;
}

bool ByteReader::u32(uint32_t* v) {
  const char* p = nullptr;
  if (!take(4, &p)) return false;
  uint32_t x = 0;
  for (int i = 0; i < 4; ++i) x |= static_cast<uint32_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  *v = x;
  return true;
}

bool ByteReader::i32(int32_t* v) {
  uint32_t x = 0;
  if (!u32(&x)) return false;
  *v = static_cast<int32_t>(x);
  return true;
}

bool ByteReader::u64(uint64_t* v) {
  const char* p = nullptr;
  if (!take(8, &p)) return false;
  uint64_t x = 0;
  for (int i = 0; i < 8; ++i) x |= static_cast<uint64_t>(static_cast<uint8_t>(p[i])) << (8 * i);
  *v = x;
  return true;
}

bool ByteReader::i64(int64_t* v) {
  uint64_t x = 0;
  if (!u64(&x)) return false;
  *v = static_cast<int64_t>(x);
  return true;
}

bool ByteReader::f64(double* v) {
  uint64_t bits = 0;
  if (!u64(&bits)) return false;
  std::memcpy(v, &bits, sizeof(bits));
  return true;
}

bool ByteReader::str(std::string* s, uint32_t max_bytes) {
  uint32_t n = 0;
  if (!u32(&n)) return false;
  if (n > max_bytes) return fail("string of " + std::to_string(n) + " bytes exceeds the limit");
  const char* p = nullptr;
  if (!take(n, &p)) return false;
  s->assign(p, n);
  return true;
}

bool ByteReader::view(std::string_view* s, uint32_t max_bytes) {
  uint32_t n = 0;
  if (!u32(&n)) return false;
  if (n > max_bytes) return fail("string of " + std::to_string(n) + " bytes exceeds the limit");
  const char* p = nullptr;
  if (!take(n, &p)) return false;
  *s = std::string_view(p, n);
  return true;
}

bool ByteReader::sizes(std::vector<int64_t>* v) {
  uint32_t n = 0;
  if (!count(&n, 8)) return false;
  v->assign(n, 0);
  for (uint32_t i = 0; i < n; ++i) {
    if (!i64(&(*v)[i])) return false;
    if ((*v)[i] < 0) return fail("negative size " + std::to_string((*v)[i]));
  }
  return true;
}

bool ByteReader::ranged(int32_t* v, int32_t lo, int32_t hi, const char* what) {
  if (!i32(v)) return false;
  if (*v < lo || *v > hi) {
    return fail(std::string(what) + " " + std::to_string(*v) + " out of range");
  }
  return true;
}

bool ByteReader::count(uint32_t* n, size_t min_entry_bytes) {
  if (!u32(n)) return false;
  if (*n > remaining() / min_entry_bytes) {
    return fail("count " + std::to_string(*n) + " overruns input");
  }
  return true;
}

void writeRequest(ByteWriter& w, const Request& r, const std::string& name) {
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
bool checkElementCount(ByteReader& in, const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d == 0) return true;
    if (n > kMaxElements / d) return in.fail("tensor shape with too many elements");
    n *= d;
  }
  return true;
}
}  // namespace

bool readRequest(ByteReader& in, Request* out) {
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
