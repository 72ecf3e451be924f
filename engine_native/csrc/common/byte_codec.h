// The one byte codec of the core's wire formats (control frames, the mesh handshake, shm
// offers, negotiation messages): little-endian fixed-width integers, IEEE-754 doubles,
// length-prefixed strings and int64 vectors. ByteWriter appends to a caller's buffer.
// ByteReader reads bytes that came from another process, so it never reads past its span:
// every read checks the remaining length first, records the first failure (what and at which
// byte) and returns false, for the caller to turn into a Status. Any thread (no shared state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "common/small_vector.h"

namespace hvd::common {

class ByteWriter {
 public:
  explicit ByteWriter(std::string* out) : out_(out) {}

  void u8(uint8_t v) { out_->push_back(static_cast<char>(v)); }
  void u16(uint16_t v) { put(v, 2); }
  void u32(uint32_t v) { put(v, 4); }
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void u64(uint64_t v) { put(v, 8); }
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void f64(double v);
  void bytes(const void* data, size_t n);   // as they are, no length
  void str(const std::string& s);           // u32 length, bytes
  void i64s(const int64_t* v, size_t n);    // u32 count, count x i64
  void i64s(const std::vector<int64_t>& v) { i64s(v.data(), v.size()); }
  template <size_t N>
  void i64s(const SmallVector<int64_t, N>& v) { i64s(v.data(), v.size()); }

 private:
  void put(uint64_t v, int width);

  std::string* out_;
};

class ByteReader {
 public:
  ByteReader(const void* data, size_t size)
      : data_(static_cast<const char*>(data)), size_(size) {}
  explicit ByteReader(const std::string& bytes) : ByteReader(bytes.data(), bytes.size()) {}
  explicit ByteReader(std::string&&) = delete;  // would read a dead temporary

  // Inline: a board post or a response list decodes a few dozen of these per op.
  bool u8(uint8_t* v) { return fixed(v); }
  bool u16(uint16_t* v) { return fixed(v); }
  bool u32(uint32_t* v) { return fixed(v); }
  bool i32(int32_t* v) { return fixed(v); }
  bool u64(uint64_t* v) { return fixed(v); }
  bool i64(int64_t* v) { return fixed(v); }
  bool f64(double* v) { return fixed(v); }
  bool bytes(void* dst, size_t n);            // n bytes as they are
  bool skip(size_t n);                        // padding
  // n bytes as a view into the input (valid while the input is).
  bool rawView(std::string_view* s, size_t n);
  bool str(std::string* s, uint32_t max_bytes);         // u32 length, bytes
  bool str(std::string_view* s, uint32_t max_bytes);    // the same, as a view into the input
  // Reads a vector whose entries must all be >= 0 (sizes, dims, counts, splits).
  bool sizes(std::vector<int64_t>* v);
  template <size_t N>
  bool sizes(SmallVector<int64_t, N>* v) {
    uint32_t n = 0;
    if (!count(&n, 8)) return false;
    v->resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      if (!nonNegative(&(*v)[i])) return false;
    }
    return true;
  }
  // Reads an int32 that must lie in [lo, hi]; `what` names the field in the error.
  bool ranged(int32_t* v, int32_t lo, int32_t hi, const char* what);
  // A list count: rejected when even `min_entry_bytes` per entry would overrun the input.
  bool count(uint32_t* n, size_t min_entry_bytes);

  bool fail(const std::string& what);  // records the first failure; returns false
  bool atEnd() const { return pos_ == size_; }
  size_t position() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }
  const std::string& error() const { return error_; }

 private:
  // The one bounds check every read goes through. Written as n > size_ - pos_ (pos_ <= size_
  // always holds), never pos_ + n > size_, which a hostile length near 2^64 would wrap.
  bool take(size_t n, const char** p) {
    if (n > size_ - pos_ || !error_.empty()) return refuse(n);
    *p = data_ + pos_;
    pos_ += n;
    return true;
  }
  bool refuse(size_t n);  // take()'s failure: records it (once), returns false
  // A little-endian value of T's width (the wire's order whatever the host's), bit for bit.
  template <typename T>
  bool fixed(T* v) {
    const char* p = nullptr;
    if (!take(sizeof(T), &p)) return false;
    uint64_t bits = 0;
    for (size_t i = 0; i < sizeof(T); ++i) bits |= uint64_t{static_cast<uint8_t>(p[i])} << (8 * i);
    if constexpr (sizeof(T) == 8) {
      std::memcpy(v, &bits, 8);
    } else {
      *v = static_cast<T>(bits);
    }
    return true;
  }
  bool nonNegative(int64_t* v);

  const char* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string error_;
};

}  // namespace hvd::common
