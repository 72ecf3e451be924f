// Validation of one complete name: rank 0 checks that the requests every live member submitted
// agree and builds the Response all of them will execute. Pure functions, called by Coordinator
// on rank 0's background thread. The first failing check wins; its error Response names the
// tensor, both ranks and both values, and every member raises it (the core stays usable).
#pragma once

#include <cstdint>
#include <vector>

#include "coord/message.h"

namespace hvd::coord {

// members: the set's global ranks, ascending. requests: one per submitting rank, ordered by
// request_rank (so by set rank). absent: members that joined (hvd.join) without submitting the
// name; only an allreduce may proceed with them, which then contribute zeros.
Response buildResponse(const std::vector<int>& members, const std::vector<Request>& requests,
                       const std::vector<int>& absent);

// Product of the dims (1 for a scalar), saturating at INT64_MAX.
int64_t elementCount(const Shape& shape);
// The bytes of a request's input: elementCount(shape) x the dtype's size.
uint64_t requestBytes(const Request& r);

}  // namespace hvd::coord
