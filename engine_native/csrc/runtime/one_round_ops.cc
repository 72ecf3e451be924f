// A one-round op on this rank (Note [One round] C in one_round.cc): every input is already in
// the board, so the op is a fold or a copy into this rank's output, with no exchange.
#include <cstring>

#include "runtime/cpu_executor.h"
#include "runtime/op_layout.h"

namespace hvd::runtime {

using common::Status;

Status CpuExecutor::oneRound(OpContext& op) {
  const coord::Response& r = op.response;
  TensorEntry* entry = op.entries.empty() ? nullptr : op.entries[0];
  const std::vector<const uint8_t*>& in = op.one_round->by_rank;
  const int n = op.comm.size();
  if (entry == nullptr || r.keys.size() != 1 || r.counts.size() != 1 ||
      in.size() != static_cast<size_t>(n)) {
    return common::internalError("a one-round op without its entry or inputs");
  }
  const size_t count = static_cast<size_t>(r.counts[0]);
  const size_t bytes = count * common::dataTypeSize(r.dtype);
  uint8_t* out = static_cast<uint8_t*>(entry->output);
  op.activities.start("ONE_ROUND");
  if (r.type == coord::OpType::kBroadcast) {
    // The root's input may be its output (in place); the board holds the same bytes.
    const uint8_t* root = in[static_cast<size_t>(r.root_rank)];
    if (out != root) std::memmove(out, root, bytes);
  } else {
    // C: the ranks' prescaled inputs folded in rank order, then the post factor.
    std::memcpy(out, in[0], bytes);
    for (int k = 1; k < n; ++k) common::reduceInto(out, in[static_cast<size_t>(k)], count,
                                                   r.dtype, r.reduce_op);
    const double post = postFactor(r, n);
    if (post != 1.0) common::scaleInPlace(out, count, r.dtype, post);
  }
  op.activities.end();
  metrics_.countOp(static_cast<int>(r.type), bytes, 1);
  metrics_.countOneRound();
  return Status::ok();
}

}  // namespace hvd::runtime
