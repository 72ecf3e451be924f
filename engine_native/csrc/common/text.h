// Text: the core's string builder for log lines and messages, `<<` as with an ostringstream
// but without iostreams.
//
// Note [No iostreams in the core]: the core shares its process with torch, the CUDA runtime
// and NCCL, each of which may bring C++ runtime code of its own. On the lent GPU machine
// (Ubuntu 24.04, GCC 13, torch 2.11+cu130, the extension linked with -Bsymbolic-functions)
// the first `std::ostringstream << int` the core ran, the staged path's warning, crashed every
// rank inside the int formatting, reading an address equal to the process id; the exact
// mechanism was not established. With iostreams gone from the core the same tests passed there
// (RESULTS.md). Text formats with std::to_string and snprintf: no locale, no facets.
// tests/unit/test_core_without_iostreams.py keeps iostream symbols out of the extension.
// Formatting matches an ostream's defaults: integers in decimal, bool as 1/0, floating point
// as "%g" (precision 6) unless precision() or fixed() says otherwise.
#pragma once

#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <type_traits>

namespace hvd::common {

// A fixed-size text field another process filled: its bytes up to the first NUL, never past
// the field (a peer's field need not be terminated).
template <size_t N>
std::string fieldText(const char (&field)[N]) {
  return std::string(field, ::strnlen(field, N));
}

// A shape as Python prints a tuple, "(4,)", "(2, 3)", "()": how errors a Python caller reads
// name a tensor's shape.
template <typename Int>
std::string tupleText(const Int* dims, size_t rank) {
  std::string out = "(";
  for (size_t k = 0; k < rank; ++k) out += (k ? ", " : "") + std::to_string(dims[k]);
  return out + (rank == 1 ? ",)" : ")");
}

class Text {
 public:
  Text& operator<<(std::string_view s) {
    out_.append(s.data(), s.size());
    return *this;
  }
  Text& operator<<(const char* s) { return *this << std::string_view(s ? s : "(null)"); }
  Text& operator<<(const std::string& s) { return *this << std::string_view(s); }
  Text& operator<<(char c) {
    out_ += c;
    return *this;
  }
  Text& operator<<(bool b) {
    out_ += b ? '1' : '0';
    return *this;
  }
  template <typename T, std::enable_if_t<std::is_integral_v<T>, int> = 0>
  Text& operator<<(T v) {
    out_ += std::to_string(v);
    return *this;
  }
  template <typename T, std::enable_if_t<std::is_floating_point_v<T>, int> = 0>
  Text& operator<<(T v) {
    char buf[352];  // "%f" of DBL_MAX has 309 digits before the point
    std::snprintf(buf, sizeof buf, fixed_ ? "%.*f" : "%.*g", precision_, static_cast<double>(v));
    out_ += buf;
    return *this;
  }
  Text& operator<<(const void* p) {
    char buf[24];
    std::snprintf(buf, sizeof buf, "%p", p);
    out_ += buf;
    return *this;
  }

  // Significant digits of floating-point values (an ostream's precision()).
  void precision(int digits) { precision_ = digits; }
  // `decimals` digits after the point (std::fixed with precision(decimals)).
  void fixed(int decimals) {
    fixed_ = true;
    precision_ = decimals;
  }
  const std::string& str() const { return out_; }

 private:
  std::string out_;
  int precision_ = 6;
  bool fixed_ = false;
};

}  // namespace hvd::common
