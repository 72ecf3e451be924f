// SpanBuffer: the elements an allreduce works on, seen as one sequence: either one contiguous
// buffer reduced in place, or a fused batch's tensors (each read from its input and written to
// its output), so the host pipeline can move a batch through shared memory without first
// packing it into a fusion buffer and unpacking it afterwards. Used on the calling thread only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace hvd::algo {

// One tensor of a fused batch: `count` elements read from `input`, the result written to
// `output` (which may equal `input`).
struct TensorSpan {
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;
};

class SpanBuffer {
 public:
  SpanBuffer(void* data, size_t element_size)
      : data_(static_cast<uint8_t*>(data)), esize_(element_size) {}
  SpanBuffer(const std::vector<TensorSpan>& spans, size_t element_size)
      : spans_(&spans), esize_(element_size) {
    starts_.reserve(spans.size() + 1);
    size_t total = 0;
    for (const TensorSpan& s : spans) {
      starts_.push_back(total);
      total += s.count;
    }
    starts_.push_back(total);
  }

  // Calls f(input, output, elements, offset) for the parts of elements [first, first + count),
  // in order; `offset` counts elements from `first`. Contiguous: one call, input == output.
  template <typename F>
  void forRange(size_t first, size_t count, F&& f) const {
    if (count == 0) return;
    if (spans_ == nullptr) {
      uint8_t* at = data_ + first * esize_;
      f(static_cast<const uint8_t*>(at), at, count, size_t{0});
      return;
    }
    // The span holding `first`: the last start <= first.
    size_t i = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), first) -
                                   starts_.begin()) - 1;
    size_t done = 0;
    while (done < count) {
      const TensorSpan& s = (*spans_)[i];
      const size_t skip = first + done - starts_[i];
      const size_t n = std::min(s.count - skip, count - done);
      if (n > 0) {
        f(static_cast<const uint8_t*>(s.input) + skip * esize_,
          static_cast<uint8_t*>(s.output) + skip * esize_, n, done);
      }
      done += n;
      ++i;
    }
  }

 private:
  uint8_t* data_ = nullptr;
  const std::vector<TensorSpan>* spans_ = nullptr;
  std::vector<size_t> starts_;  // element index where each span starts, then the total
  size_t esize_;
};

}  // namespace hvd::algo
