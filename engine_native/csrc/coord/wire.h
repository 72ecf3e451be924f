// Wire primitives under the negotiation messages: little-endian fixed-width integers, IEEE-754
// doubles, length-prefixed strings and int64 vectors. ByteReader never reads past its buffer:
// every read checks the remaining length first, records the first failure (what and where) and
// returns false, so decoders turn bytes from a hostile or broken peer into a kInternal Status.
// Used by message.cc and request_cache.cc only; any thread (no shared state).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/small_vector.h"

#include "coord/message.h"

namespace hvd::coord::wire {

constexpr uint32_t kMaxNameBytes = 64 * 1024;    // tensor names
constexpr uint32_t kMaxErrorBytes = 1u << 20;    // error text in a Response
constexpr uint8_t kRequestListTag = 0x51;        // 'Q': first byte of an encoded RequestList
constexpr uint8_t kResponseListTag = 0x52;       // 'R': first byte of an encoded ResponseList

class ByteWriter {
 public:
  void u8(uint8_t v) { out_.push_back(static_cast<char>(v)); }
  void u32(uint32_t v);
  void i32(int32_t v) { u32(static_cast<uint32_t>(v)); }
  void u64(uint64_t v);
  void i64(int64_t v) { u64(static_cast<uint64_t>(v)); }
  void f64(double v);
  void str(const std::string& s);               // u32 length, bytes
  void i64s(const int64_t* v, size_t n);        // u32 count, count x i64
  void i64s(const std::vector<int64_t>& v) { i64s(v.data(), v.size()); }
  template <size_t N>
  void i64s(const common::SmallVector<int64_t, N>& v) { i64s(v.data(), v.size()); }
  void reserve(size_t n) { out_.reserve(n); }
  std::string take() { return std::move(out_); }

 private:
  std::string out_;
};

class ByteReader {
 public:
  explicit ByteReader(const std::string& bytes) : data_(bytes.data()), size_(bytes.size()) {}

  bool u8(uint8_t* v);
  bool u32(uint32_t* v);
  bool i32(int32_t* v);
  bool u64(uint64_t* v);
  bool i64(int64_t* v);
  bool f64(double* v);
  bool str(std::string* s, uint32_t max_bytes);
  // A string as a view into the input (valid while the input is).
  bool view(std::string_view* s, uint32_t max_bytes);
  // Reads a vector whose entries must all be >= 0 (sizes, dims, counts, splits).
  bool sizes(std::vector<int64_t>* v);
  template <size_t N>
  bool sizes(common::SmallVector<int64_t, N>* v) {
    uint32_t n = 0;
    if (!count(&n, 8)) return false;
    v->resize(n);
    for (uint32_t i = 0; i < n; ++i) {
      if (!i64(&(*v)[i])) return false;
      if ((*v)[i] < 0) return fail("negative size " + std::to_string((*v)[i]));
    }
    return true;
  }
  // Reads an int32 that must lie in [lo, hi]; `what` names the field in the error.
  bool ranged(int32_t* v, int32_t lo, int32_t hi, const char* what);
  // A list count: rejected when even `min_entry_bytes` per entry would overrun the buffer.
  bool count(uint32_t* n, size_t min_entry_bytes);

  bool fail(const std::string& what);           // records the first failure; returns false
  bool atEnd() const { return pos_ == size_; }
  size_t remaining() const { return size_ - pos_; }
  const std::string& error() const { return error_; }

 private:
  bool take(size_t n, const char** p);

  const char* data_;
  size_t size_;
  size_t pos_ = 0;
  std::string error_;
};

// Every field of a Request, in declaration order (the "full" form of a request on the wire).
void writeRequest(ByteWriter& w, const Request& r, const std::string& name);
bool readRequest(ByteReader& r, Request* out);

}  // namespace hvd::coord::wire
