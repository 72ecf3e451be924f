// A one-round op on this rank (Note [One round] C in one_round.cc): every input is already in
// the board, so the op is a fold or copies into this rank's output, with no exchange. Outputs
// the core allocates are laid out by op_layout.h, as for the negotiated ops.
//
// Note [Output guesses]
// An allgather's, alltoall's or reducescatter's output depends on the other ranks' rows, so
// the core allocates it (hostOutput: a shared_ptr and a malloc per op) and the binding wraps
// it as an array: ~1,900 instructions of a 4 B op that allreduce, writing into an output from
// the numpy pool, does not pay. A caller may instead pass a guess (EnqueueArgs::output,
// output_bytes): size x its input for an allgather, its input's size for an alltoall of even
// splits (every rank's rows alike, the usual case), its own slice for a reducescatter. A board
// op whose result is exactly output_bytes writes there and returns no buffer; any other
// result, and every negotiated op, gets a buffer of its own as before, so a wrong guess costs
// only the guess.
#include <cstring>

#include "runtime/cpu_executor.h"
#include "runtime/host_output_pool.h"
#include "runtime/op_layout.h"

namespace hvd::runtime {

using common::Status;
using coord::OpType;

namespace {

// Every rank's prescaled input, from byte `offset` on, folded in rank order into `out` (count
// elements), then the post factor: the same bits on every rank (elementwise, so a slice folds
// to the bits of the same slice of the whole).
void fold(const coord::Response& r, const std::vector<const uint8_t*>& in, size_t offset,
          size_t count, uint8_t* out) {
  const int n = static_cast<int>(in.size());
  if (count == 0) return;  // a reducescatter rank with no rows
  std::memcpy(out, in[0] + offset, count * common::dataTypeSize(r.dtype));
  for (int k = 1; k < n; ++k) {
    common::reduceInto(out, in[static_cast<size_t>(k)] + offset, count, r.dtype, r.reduce_op);
  }
  const double post = postFactor(r, n);
  if (post != 1.0) common::scaleInPlace(out, count, r.dtype, post);
}

}  // namespace

Status CpuExecutor::oneRound(OpContext& op) {
  const coord::Response& r = op.response;
  TensorEntry* entry = op.entries.empty() ? nullptr : op.entries[0];
  const std::vector<const uint8_t*>& in = op.one_round->by_rank;
  const int n = op.comm.size();
  const int me = op.comm.rank();
  if (entry == nullptr || r.keys.size() != 1 || in.size() != static_cast<size_t>(n)) {
    return common::internalError("a one-round op without its entry or inputs");
  }
  const size_t elem = common::dataTypeSize(r.dtype);
  size_t bytes = 0;
  op.activities.start("ONE_ROUND");
  switch (r.type) {
    case OpType::kAllreduce:
      bytes = static_cast<size_t>(r.counts[0]) * elem;
      fold(r, in, 0, static_cast<size_t>(r.counts[0]), static_cast<uint8_t*>(entry->output));
      break;
    case OpType::kBroadcast: {
      // The root's input may be its output (in place); the board holds the same bytes.
      bytes = broadcastBytes(r);
      const uint8_t* root = in[static_cast<size_t>(r.root_rank)];
      if (entry->output != root) std::memmove(entry->output, root, bytes);
      break;
    }
    case OpType::kAllgather: {
      const GatherLayout layout = allgatherLayout(r);
      op.result->shape = layout.shape;
      uint8_t* out = static_cast<uint8_t*>(entry->output);  // Note [Output guesses]
      if (out == nullptr || layout.total != entry->output_bytes) {
        op.result->buffer = hostOutput(layout.total);
        out = op.result->buffer->data;
      }
      for (int k = 0; k < n; ++k) {
        const size_t part = layout.bytes[static_cast<size_t>(k)];
        if (part > 0) std::memcpy(out, in[static_cast<size_t>(k)], part);
        out += part;
      }
      bytes = layout.total;
      break;
    }
    case OpType::kAlltoall: {
      const AlltoallLayout layout = alltoallLayout(r, me, n);
      op.result->shape = layout.shape;
      op.result->received_splits = layout.received_splits;
      size_t row = elem;  // bytes of one row: the dims after the first
      for (int64_t d : r.row_shape) row *= static_cast<size_t>(d);
      uint8_t* out = static_cast<uint8_t*>(entry->output);  // Note [Output guesses]
      if (out == nullptr || layout.total != entry->output_bytes) {
        op.result->buffer = hostOutput(layout.total);
        out = op.result->buffer->data;
      }
      for (int k = 0; k < n; ++k) {  // rank k's rows for this rank follow its rows for lower ranks
        int64_t before = 0;
        for (int j = 0; j < me; ++j) before += r.splits_matrix[static_cast<size_t>(k * n + j)];
        const size_t part = layout.recv[static_cast<size_t>(k)];
        if (part > 0) {
          std::memcpy(out, in[static_cast<size_t>(k)] + static_cast<size_t>(before) * row, part);
        }
        out += part;
      }
      bytes = layout.total;
      break;
    }
    case OpType::kReducescatter: {  // only this rank's slice is folded (and read)
      const ReducescatterLayout layout = reducescatterLayout(r, me, n);
      size_t offset = 0;
      for (int k = 0; k < me; ++k) offset += layout.counts[static_cast<size_t>(k)];
      const size_t count = layout.counts[static_cast<size_t>(me)];
      op.result->shape = layout.shape;
      uint8_t* out = static_cast<uint8_t*>(entry->output);  // Note [Output guesses]
      if (out == nullptr || count * elem != entry->output_bytes) {
        op.result->buffer = hostOutput(count * elem);
        out = op.result->buffer->data;
      }
      fold(r, in, offset * elem, count, out);
      bytes = layout.input_bytes;
      break;
    }
    default:
      op.activities.end();
      return common::internalError("a one-round op of an unsupported type");
  }
  op.activities.end();
  metrics_.countOp(static_cast<int>(r.type), bytes, 1);
  metrics_.countOneRound();
  return Status::ok();
}

}  // namespace hvd::runtime
