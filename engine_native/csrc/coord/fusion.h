// Response fusion: packs ready allreduce (and host allgather) Responses that can share one
// fusion buffer into one Response. Pure function, called by Coordinator::takeReady on rank 0's
// background thread; the fused list is what every rank executes, so only rank 0 ever decides
// fusion.
#pragma once

#include <cstdint>
#include <vector>

#include "coord/message.h"

namespace hvd::coord {

// Allreduces with equal dtype, reduce op, prescale, postscale, process set and device kind
// (CPU / GPU) merge, and so do host allgathers with equal dtype and process set (Note
// [Allgather fusion] in fusion.cc; their bytes are the whole gathered output, and their
// batches stop at 2 MiB: Note [Allgather fusion limit]), names in order, while the fused byte
// total stays <= threshold_bytes;
// threshold 0 disables fusion, and a tensor larger than the threshold goes alone. Look-ahead: a
// response that does not match is passed over and keeps its place, so interleaved fp16/fp32
// gradients still fuse. A fused response takes the position of its first member; the relative
// order of everything else is preserved. Barrier and join responses are fences: nothing fuses
// across them.
std::vector<Response> fuseResponses(std::vector<Response> ready, int64_t threshold_bytes);

// The same rules, one response at a time: responses added to a batch fuse exactly as
// fuseResponses would fuse the whole sequence. Rank 0 holds released responses in one while
// the batching window is open, so each arrival costs O(open keys), not a pass over the batch.
class FusionBatch {
 public:
  explicit FusionBatch(int64_t threshold_bytes = 0) : threshold_(threshold_bytes) {}
  // A new threshold applies to what is added from now on.
  void setThreshold(int64_t threshold_bytes) { threshold_ = threshold_bytes; }
  void add(Response&& response);
  void addAll(std::vector<Response>&& responses);
  bool empty() const { return out_.empty(); }
  const std::vector<Response>& responses() const { return out_; }
  // Bytes of the successful allreduces in the batch, and whether there is any.
  int64_t allreduceBytes() const { return allreduce_bytes_; }
  bool hasAllreduce() const { return has_allreduce_; }
  // The fused responses, in order; the batch is empty afterwards.
  std::vector<Response> take();

 private:
  struct Open {
    uint64_t key_hash;  // of the fusion key, to skip most comparisons
    size_t index;       // position of the fused response in out_
    int64_t bytes;      // its byte total so far
  };
  int64_t threshold_;
  std::vector<Response> out_;
  std::vector<Open> open_;
  int64_t allreduce_bytes_ = 0;
  bool has_allreduce_ = false;
};

// Bytes an allreduce response moves per rank (sum of counts x element size), or an allgather
// response gathers (every rank's rows of every tensor), saturating.
int64_t responseBytes(const Response& response);

}  // namespace hvd::coord
