// Fusion in one pass: each fusion key (dtype, reduce op, scales, set, device kind) has at most
// one "open" fused response in the output. A matching response joins it while the byte total
// stays within the threshold, otherwise it opens a new one at its own position. Passing over
// non-matching responses this way is the look-ahead; it costs O(n k) for n responses and k open
// keys (a step has one or two). Equivalent to the scan-and-skip of Horovod's FuseResponses
// without its O(n^2) rescans.
#include "coord/fusion.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <tuple>

namespace hvd::coord {

namespace {

// Doubles are keyed by their bits: exact equality, and a strict order even for NaN.
uint64_t bitsOf(double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

using FusionKey = std::tuple<int32_t, int32_t, uint64_t, uint64_t, int32_t, bool>;

FusionKey keyOf(const Response& r) {
  return FusionKey(static_cast<int32_t>(r.dtype), static_cast<int32_t>(r.reduce_op),
                   bitsOf(r.prescale), bitsOf(r.postscale), r.process_set, r.device >= 0);
}

bool fusable(const Response& r) {
  return r.status == ResponseType::kOk && r.type == OpType::kAllreduce && !r.keys.empty() &&
         r.counts.size() == r.keys.size();
}

bool isFence(const Response& r) { return r.type == OpType::kBarrier || r.type == OpType::kJoin; }

struct Open {
  FusionKey key;
  size_t index;   // position of the fused response in the output
  int64_t bytes;  // its byte total so far
};

}  // namespace

int64_t responseBytes(const Response& response) {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t element = static_cast<int64_t>(common::dataTypeSize(response.dtype));
  int64_t total = 0;
  for (int64_t count : response.counts) {
    if (count > 0 && element > 0 && count > (kMax - total) / element) return kMax;
    total += count * element;
  }
  return total;
}

std::vector<Response> fuseResponses(std::vector<Response> ready, int64_t threshold_bytes) {
  if (threshold_bytes <= 0 || ready.size() < 2) return ready;
  std::vector<Response> out;
  out.reserve(ready.size());
  std::vector<Open> open;
  for (Response& r : ready) {
    if (isFence(r)) open.clear();
    if (!fusable(r)) {
      out.push_back(std::move(r));
      continue;
    }
    const int64_t bytes = responseBytes(r);
    const FusionKey key = keyOf(r);
    auto it = std::find_if(open.begin(), open.end(), [&key](const Open& o) { return o.key == key; });
    if (it != open.end() && bytes <= threshold_bytes - it->bytes) {
      Response& fused = out[it->index];
      fused.keys.append(r.keys);
      fused.counts.append(r.counts);
      it->bytes += bytes;
      continue;
    }
    if (it != open.end()) {
      *it = Open{key, out.size(), bytes};
    } else {
      open.push_back(Open{key, out.size(), bytes});
    }
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace hvd::coord
