// The response an agreed board op runs with (Note [One round] B in runtime/one_round.cc): what
// rank 0's validation (coord::buildResponse) would build from every rank's post, or a refusal
// that sends the op to rank 0, which then reports the error on every rank. Posts are another
// process's bytes (decoded and bounded by decodePost, runtime/one_round_post.h).
#pragma once

#include <vector>

#include "coord/message.h"
#include "runtime/one_round_post.h"

namespace hvd::runtime::one_round {

// `ops[r]`: rank r's post of the op, all kData with sameParams() as `mine` (this rank's).
// allreduce, broadcast, and allgather, alltoall and reducescatter of at least one dim are
// answered from the posts directly; anything else through respondByValidation. `members`:
// the global set's ranks; `scratch`: reused storage.
bool respond(const PostedOp& mine, const std::vector<const PostedOp*>& ops, coord::Key key,
             const std::vector<int>& members, std::vector<coord::Request>* scratch,
             coord::Response* out);

// The same answer through coord::buildResponse on the requests the posts spell, each shape
// checked against the data decoded with it: the reference respond() must equal (tests/fuzz's
// one_round_respond target compares them).
bool respondByValidation(const PostedOp& mine, const std::vector<const PostedOp*>& ops,
                         coord::Key key, const std::vector<int>& members,
                         std::vector<coord::Request>* scratch, coord::Response* out);

}  // namespace hvd::runtime::one_round
