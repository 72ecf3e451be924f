// Fusion in one pass (FusionBatch): each fusion key (op type, dtype, reduce op, scales, set,
// device kind) has at most one "open" fused response in the output. A matching response joins it
// while the byte total stays within the threshold, otherwise it opens a new one at its own
// position. Passing over
// non-matching responses this way is the look-ahead; it costs O(n k) for n responses and k open
// keys (a step has one or two). Equivalent to the scan-and-skip of Horovod's FuseResponses
// without its O(n^2) rescans.
#include "coord/fusion.h"

#include <algorithm>
#include <cstring>
#include <limits>

namespace hvd::coord {

namespace {

// Doubles are keyed by their bits: exact equality, and a strict order even for NaN.
uint64_t bitsOf(double v) {
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

// The fusion key: op type, dtype, reduce op, scales, set, device kind.
bool sameFusionKey(const Response& a, const Response& b) {
  return a.type == b.type && a.dtype == b.dtype && a.reduce_op == b.reduce_op &&
         bitsOf(a.prescale) == bitsOf(b.prescale) && bitsOf(a.postscale) == bitsOf(b.postscale) &&
         a.process_set == b.process_set && (a.device >= 0) == (b.device >= 0);
}

uint64_t fusionKeyHash(const Response& r) {
  uint64_t h = static_cast<uint64_t>(r.dtype) * 0x9e3779b97f4a7c15ull;
  h ^= static_cast<uint64_t>(r.type) * 0xc2b2ae3d27d4eb4full + (h << 6) + (h >> 2);
  h ^= static_cast<uint64_t>(r.reduce_op) + 0x7f4a7c159e3779b9ull + (h << 6) + (h >> 2);
  h ^= bitsOf(r.prescale) + (h << 6) + (h >> 2);
  h ^= bitsOf(r.postscale) + (h << 6) + (h >> 2);
  h ^= static_cast<uint64_t>(static_cast<uint32_t>(r.process_set)) + (h << 6) + (h >> 2);
  return h ^ (r.device >= 0 ? 1 : 0);
}

// Note [Allgather fusion]: allgathers fuse like allreduces (Horovod's FuseResponses does both),
// but only host tensors: the device executors gather one tensor per response, and a fused
// device allgather would need its own packing kernels and staging for no measured gain yet.
// A fused allgather's Response lists per tensor its row dims in counts and its row shape in
// row_shape (concatenated), and first_dims holds tensor-major the first dim of every set rank
// (coord/message.h); the executor gathers all of them as one allgatherv (runtime/op_layout.h).
//
// Note [Allgather fusion limit]: fusing saves a collective's fixed cost but costs two copies
// (this rank's part in, every rank's parts out) per byte, and a large fused buffer leaves the
// caches. Against HVD_FUSION_THRESHOLD=0 on the loaded 2-core VM, batches up to the 64 MiB
// threshold gained nothing on 64 x 64 KiB and lost on 4 x 4 MiB; held to 2 MiB gathered,
// 64 x 64 KiB gained and 64 x 4 KiB (one op) kept its gain
// (benchmarks/history/RESULTS-parts-1-10.md, "Grouped allgather fused (issue #20, part 4)";
// the current run: benchmarks/RESULTS.md, "Grouped allgather and blocking groups"). So an
// allgather batch stops at 2 MiB gathered (or the threshold, if smaller), and a tensor
// gathering more than that goes alone, without closing the open batch.
constexpr int64_t kMaxFusedAllgatherBytes = int64_t{2} << 20;

int64_t allgatherBytes(const Response& r);

bool fusable(const Response& r) {
  if (r.status != ResponseType::kOk || r.keys.empty() || r.counts.size() != r.keys.size()) {
    return false;
  }
  if (r.type == OpType::kAllgather) {
    return r.device < 0 && allgatherBytes(r) <= kMaxFusedAllgatherBytes;
  }
  return r.type == OpType::kAllreduce;
}

// Bytes an allgather response gathers on every rank (all ranks' rows of all its tensors).
int64_t allgatherBytes(const Response& r) {
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t element = static_cast<int64_t>(common::dataTypeSize(r.dtype));
  const size_t tensors = r.keys.size();
  if (tensors == 0 || r.first_dims.size() % tensors != 0) return kMax;
  const size_t ranks = r.first_dims.size() / tensors;
  int64_t total = 0;
  size_t dim = 0;
  for (size_t i = 0; i < tensors; ++i) {
    int64_t row = element;
    for (int64_t d = 0; d < r.counts[i]; ++d, ++dim) {
      if (dim >= r.row_shape.size()) return kMax;
      const int64_t extent = r.row_shape[dim];
      if (extent > 0 && row > kMax / extent) return kMax;
      row *= extent;
    }
    for (size_t k = 0; k < ranks; ++k) {
      const int64_t rows = r.first_dims[i * ranks + k];
      if (rows > 0 && row > 0 && rows > (kMax - total) / row) return kMax;
      total += rows * row;
    }
  }
  return total;
}

bool isFence(const Response& r) { return r.type == OpType::kBarrier || r.type == OpType::kJoin; }

}  // namespace

int64_t responseBytes(const Response& response) {
  if (response.type == OpType::kAllgather) return allgatherBytes(response);
  const int64_t kMax = std::numeric_limits<int64_t>::max();
  const int64_t element = static_cast<int64_t>(common::dataTypeSize(response.dtype));
  int64_t total = 0;
  for (int64_t count : response.counts) {
    if (count > 0 && element > 0 && count > (kMax - total) / element) return kMax;
    total += count * element;
  }
  return total;
}

void FusionBatch::add(Response&& r) {
  if (isFence(r)) open_.clear();
  if (!fusable(r)) {
    out_.push_back(std::move(r));
    return;
  }
  const int64_t bytes = responseBytes(r);
  if (r.type == OpType::kAllreduce) {
    has_allreduce_ = true;
    allreduce_bytes_ = bytes > std::numeric_limits<int64_t>::max() - allreduce_bytes_
                           ? std::numeric_limits<int64_t>::max()
                           : allreduce_bytes_ + bytes;
  }
  const uint64_t hash = fusionKeyHash(r);
  Open* open = nullptr;
  for (Open& o : open_) {
    if (o.key_hash == hash && sameFusionKey(out_[o.index], r)) open = &o;
  }
  const int64_t limit = r.type == OpType::kAllgather
                            ? std::min(threshold_, kMaxFusedAllgatherBytes)
                            : threshold_;
  if (threshold_ > 0 && open != nullptr && bytes <= limit - open->bytes) {
    Response& fused = out_[open->index];
    fused.keys.append(r.keys);
    fused.counts.append(r.counts);
    if (r.type == OpType::kAllgather) {
      fused.first_dims.insert(fused.first_dims.end(), r.first_dims.begin(), r.first_dims.end());
      fused.row_shape.insert(fused.row_shape.end(), r.row_shape.begin(), r.row_shape.end());
    }
    open->bytes += bytes;
    return;
  }
  if (threshold_ > 0) {
    if (open != nullptr) {
      *open = Open{hash, out_.size(), bytes};
    } else {
      open_.push_back(Open{hash, out_.size(), bytes});
    }
  }
  out_.push_back(std::move(r));
}

void FusionBatch::addAll(std::vector<Response>&& responses) {
  if (out_.empty()) out_.reserve(responses.size());
  for (Response& r : responses) add(std::move(r));
}

std::vector<Response> FusionBatch::take() {
  std::vector<Response> out;
  out.swap(out_);
  open_.clear();
  allreduce_bytes_ = 0;
  has_allreduce_ = false;
  return out;
}

std::vector<Response> fuseResponses(std::vector<Response> ready, int64_t threshold_bytes) {
  if (threshold_bytes <= 0 || ready.size() < 2) return ready;
  FusionBatch batch(threshold_bytes);
  batch.addAll(std::move(ready));
  return batch.take();
}

}  // namespace hvd::coord
