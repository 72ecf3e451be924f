// The byte codec (common/byte_codec.h).
#include "common/byte_codec.h"

#include <cstring>

namespace hvd::common {

void ByteWriter::put(uint64_t v, int width) {
  char bytes[8];
  for (int i = 0; i < width; ++i) bytes[i] = static_cast<char>((v >> (8 * i)) & 0xff);
  out_->append(bytes, static_cast<size_t>(width));
}

void ByteWriter::f64(double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  u64(bits);
}

void ByteWriter::bytes(const void* data, size_t n) {
  out_->append(static_cast<const char*>(data), n);
}

void ByteWriter::str(const std::string& s) {
  u32(static_cast<uint32_t>(s.size()));
  out_->append(s);
}

void ByteWriter::i64s(const int64_t* v, size_t n) {
  u32(static_cast<uint32_t>(n));
  for (size_t i = 0; i < n; ++i) i64(v[i]);
}

bool ByteReader::fail(const std::string& what) {
  if (error_.empty()) error_ = what + " at byte " + std::to_string(pos_);
  return false;
}

bool ByteReader::refuse(size_t n) {
  if (!error_.empty()) return false;
  return fail("truncated input (" + std::to_string(n) + " bytes needed)");
}

bool ByteReader::bytes(void* dst, size_t n) {
  const char* p = nullptr;
  if (!take(n, &p)) return false;
  if (n > 0) std::memcpy(dst, p, n);
  return true;
}

bool ByteReader::skip(size_t n) {
  const char* p = nullptr;
  return take(n, &p);
}

bool ByteReader::rawView(std::string_view* s, size_t n) {
  const char* p = nullptr;
  if (!take(n, &p)) return false;
  *s = std::string_view(p, n);
  return true;
}

bool ByteReader::str(std::string_view* s, uint32_t max_bytes) {
  uint32_t n = 0;
  if (!u32(&n)) return false;
  if (n > max_bytes) return fail("string of " + std::to_string(n) + " bytes exceeds the limit");
  return rawView(s, n);
}

bool ByteReader::str(std::string* s, uint32_t max_bytes) {
  std::string_view v;
  if (!str(&v, max_bytes)) return false;
  s->assign(v.data(), v.size());
  return true;
}

bool ByteReader::nonNegative(int64_t* v) {
  if (!i64(v)) return false;
  if (*v < 0) return fail("negative size " + std::to_string(*v));
  return true;
}

bool ByteReader::sizes(std::vector<int64_t>* v) {
  uint32_t n = 0;
  if (!count(&n, 8)) return false;
  v->assign(n, 0);
  for (uint32_t i = 0; i < n; ++i) {
    if (!nonNegative(&(*v)[i])) return false;
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

}  // namespace hvd::common
