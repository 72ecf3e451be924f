// SmallVector<T, N>: a vector of trivially copyable T that keeps up to N elements inline, so
// the common one-tensor Response is copied and moved without touching the heap (the steady
// state of a training step copies thousands of them). Grows onto the heap like std::vector.
// Only what the core uses: no exceptions beyond std::bad_alloc, no non-trivial T.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <new>
#include <type_traits>

namespace hvd::common {

template <typename T, size_t N>
class SmallVector {
  static_assert(std::is_trivially_copyable<T>::value, "SmallVector holds plain data only");

 public:
  using value_type = T;
  using iterator = T*;
  using const_iterator = const T*;

  SmallVector() = default;
  SmallVector(std::initializer_list<T> values) { assign(values.begin(), values.end()); }
  SmallVector(const SmallVector& other) { assign(other.begin(), other.end()); }
  SmallVector(SmallVector&& other) noexcept { take(other); }
  SmallVector& operator=(const SmallVector& other) {
    if (this != &other) assign(other.begin(), other.end());
    return *this;
  }
  SmallVector& operator=(SmallVector&& other) noexcept {
    if (this != &other) {
      release();
      take(other);
    }
    return *this;
  }
  ~SmallVector() { release(); }

  size_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T& front() { return data_[0]; }
  const T& front() const { return data_[0]; }
  T& back() { return data_[size_ - 1]; }

  void clear() { size_ = 0; }
  void reserve(size_t n) {
    if (n > capacity_) grow(n);
  }
  void resize(size_t n, T value = T()) {
    reserve(n);
    for (size_t i = size_; i < n; ++i) data_[i] = value;
    size_ = n;
  }
  void push_back(const T& value) {
    if (size_ == capacity_) grow(capacity_ * 2);
    data_[size_++] = value;
  }
  void assign(const T* first, const T* last) {
    const size_t n = static_cast<size_t>(last - first);
    reserve(n);
    if (n > 0) std::memmove(data_, first, n * sizeof(T));
    size_ = n;
  }
  void append(const T* first, const T* last) {
    const size_t n = static_cast<size_t>(last - first);
    if (size_ + n > capacity_) grow(std::max(size_ + n, capacity_ * 2));
    if (n > 0) std::memmove(data_ + size_, first, n * sizeof(T));
    size_ += n;
  }
  void append(const SmallVector& other) { append(other.begin(), other.end()); }

  friend bool operator==(const SmallVector& a, const SmallVector& b) {
    if (a.size_ != b.size_) return false;
    for (size_t i = 0; i < a.size_; ++i) {
      if (!(a.data_[i] == b.data_[i])) return false;
    }
    return true;
  }

 private:
  bool onHeap() const { return data_ != inline_; }
  void release() {
    if (onHeap()) std::free(data_);
    data_ = inline_;
    capacity_ = N;
    size_ = 0;
  }
  void take(SmallVector& other) {
    if (other.onHeap()) {
      data_ = other.data_;
      capacity_ = other.capacity_;
    } else if (other.size_ > 0) {
      std::memcpy(inline_, other.inline_, other.size_ * sizeof(T));
    }
    size_ = other.size_;
    other.data_ = other.inline_;
    other.capacity_ = N;
    other.size_ = 0;
  }
  void grow(size_t n) {
    if (n < N * 2) n = N * 2;
    T* fresh = static_cast<T*>(std::malloc(n * sizeof(T)));
    if (fresh == nullptr) throw std::bad_alloc();
    if (size_ > 0) std::memcpy(fresh, data_, size_ * sizeof(T));
    if (onHeap()) std::free(data_);
    data_ = fresh;
    capacity_ = n;
  }

  T inline_[N];
  T* data_ = inline_;
  size_t size_ = 0;
  size_t capacity_ = N;
};

}  // namespace hvd::common
