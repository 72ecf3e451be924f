// Response fusion: packs ready allreduce Responses that can share one fusion buffer into one
// Response. Pure function, called by Coordinator::takeReady on rank 0's background thread; the
// fused list is what every rank executes, so only rank 0 ever decides fusion.
#pragma once

#include <cstdint>
#include <vector>

#include "coord/message.h"

namespace hvd::coord {

// Allreduces with equal dtype, reduce op, prescale, postscale, process set and device kind
// (CPU / GPU) merge, names in order, while the fused byte total stays <= threshold_bytes;
// threshold 0 disables fusion, and a tensor larger than the threshold goes alone. Look-ahead: a
// response that does not match is passed over and keeps its place, so interleaved fp16/fp32
// gradients still fuse. A fused response takes the position of its first member; the relative
// order of everything else is preserved. Barrier and join responses are fences: nothing fuses
// across them.
std::vector<Response> fuseResponses(std::vector<Response> ready, int64_t threshold_bytes);

// Bytes an allreduce response moves per rank (sum of counts x element size), saturating.
int64_t responseBytes(const Response& response);

}  // namespace hvd::coord
