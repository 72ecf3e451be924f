#include "runtime/cpu_executor.h"

#include <algorithm>
#include <cstring>

#include "algo/shared_outputs.h"
#include "runtime/host_output_pool.h"
#include "runtime/op_layout.h"

namespace hvd::runtime {

using common::Status;
using coord::OpType;

uint8_t* CpuExecutor::fusionBuffer(size_t bytes) {
  if (fusion_buffer_.size() < bytes) fusion_buffer_.resize(bytes);
  return fusion_buffer_.data();
}

// Note [Fusion without a buffer]: when the host pipeline serves the set (allreduceTakesTensors)
// and nothing has to be scaled before the reduction, a fused batch (or an out-of-place single
// tensor) is handed to it as its tensors: it reads the inputs and writes the outputs directly,
// and the copies into and out of the fusion buffer (MEMCPY_*_FUSION_BUFFER) do not happen.
// Elsewhere — TCP, a joined rank's zeros, a prescale factor, small batches — the batch is
// packed into the persistent fusion buffer as before.
bool CpuExecutor::allreduceTensors(OpContext& op, size_t total, Status* status) {
  const coord::Response& r = op.response;
  const auto& entries = op.entries;
  if (r.prescale != 1.0 || (r.keys.size() == 1 && entries[0] != nullptr &&
                            entries[0]->input == entries[0]->output)) {
    return false;
  }
  spans_.clear();
  for (size_t i = 0; i < r.keys.size(); ++i) {
    if (entries[i] == nullptr) return false;  // a joined rank: its zeros need the buffer
    spans_.push_back({entries[i]->input, entries[i]->output, static_cast<size_t>(r.counts[i])});
  }
  algo::AllreduceOptions opts;
  opts.tensors = &spans_;
  opts.count = total;
  opts.dtype = r.dtype;
  opts.op = r.reduce_op;
  if (!algo::allreduceTakesTensors(op.comm, opts, op.choice)) return false;
  op.activities.start("_ALLREDUCE");
  *status = algo::allreduce(op.comm, opts, op.choice);
  if (!status->isOk()) return true;
  op.activities.end();
  const double post = postFactor(r, op.comm.size());
  if (post != 1.0) {
    for (const algo::TensorSpan& s : spans_) common::scaleInPlace(s.output, s.count, r.dtype, post);
  }
  return true;
}

Status allreduceHostBuffer(OpContext& op, void* buffer, size_t count, size_t segment_bytes) {
  const coord::Response& r = op.response;
  if (r.prescale != 1.0) common::scaleInPlace(buffer, count, r.dtype, r.prescale);
  algo::AllreduceOptions opts;
  opts.data = buffer;
  opts.count = count;
  opts.dtype = r.dtype;
  opts.op = r.reduce_op;
  opts.segment_bytes = segment_bytes;
  double post = postFactor(r, op.comm.size());
  const bool adasum = r.reduce_op == common::ReduceOp::kAdasum;
  if (adasum) {
    // Per tensor, not per element; the hierarchical form sums hosts, and Horovod divides its
    // result by the host size (postscale /= local_size).
    opts.tensor_counts = r.counts.data();
    opts.tensor_count = r.counts.size();
    post /= algo::adasumHostAverage(op.comm, op.choice);
  }
  op.activities.start(adasum ? "_ADASUM_ALLREDUCE" : "_ALLREDUCE");
  HVD_RETURN_IF_ERROR(algo::allreduce(op.comm, opts, op.choice));
  op.activities.end();
  if (post != 1.0) common::scaleInPlace(buffer, count, r.dtype, post);
  return Status::ok();
}

Status CpuExecutor::allreduce(OpContext& op) {
  if (op.one_round != nullptr) return oneRound(op);
  const coord::Response& r = op.response;
  const auto& entries = op.entries;
  const size_t elem = common::dataTypeSize(r.dtype);
  const int64_t total = totalCount(r);
  const size_t bytes = static_cast<size_t>(total) * elem;
  Status direct;
  if (allreduceTensors(op, static_cast<size_t>(total), &direct)) {
    HVD_RETURN_IF_ERROR(direct);
    metrics_.countOp(static_cast<int>(OpType::kAllreduce), bytes, r.keys.size());
    return Status::ok();
  }
  const bool fused = r.keys.size() > 1 || entries[0] == nullptr;
  uint8_t* buffer = nullptr;
  if (fused) {
    // Copy every tensor into its slot of the fusion buffer; a joined rank's slots stay zero.
    op.activities.start("MEMCPY_IN_FUSION_BUFFER");
    buffer = fusionBuffer(bytes);
    size_t offset = 0;
    for (size_t i = 0; i < r.keys.size(); ++i) {
      const size_t n = static_cast<size_t>(r.counts[i]) * elem;
      if (entries[i] != nullptr && n > 0) {
        std::memcpy(buffer + offset, entries[i]->input, n);
      } else if (n > 0) {
        std::memset(buffer + offset, 0, n);
      }
      offset += n;
    }
    op.activities.end();
  } else {
    buffer = static_cast<uint8_t*>(entries[0]->output);
    if (entries[0]->input != entries[0]->output && bytes > 0) {
      std::memcpy(buffer, entries[0]->input, bytes);
    }
  }
  HVD_RETURN_IF_ERROR(allreduceHostBuffer(op, buffer, static_cast<size_t>(total),
                                          static_cast<size_t>(config_.tcp_segment_bytes)));
  if (fused) {
    op.activities.start("MEMCPY_OUT_FUSION_BUFFER");
    size_t offset = 0;
    for (size_t i = 0; i < r.keys.size(); ++i) {
      const size_t n = static_cast<size_t>(r.counts[i]) * elem;
      if (entries[i] != nullptr && n > 0) std::memcpy(entries[i]->output, buffer + offset, n);
      offset += n;
    }
    op.activities.end();
  }
  metrics_.countOp(static_cast<int>(OpType::kAllreduce), bytes, r.keys.size());
  return Status::ok();
}

// Note [Fused allgather]: a fused allgather (Note [Allgather fusion] in coord/fusion.cc) is one
// allgatherv over the fusion buffer: this rank copies its part of every tensor into its block
// (MEMCPY_IN_FUSION_BUFFER), the algorithm the set would use for one tensor (host segment,
// hierarchical, ring; shm or TCP pairs) gathers the blocks, and each tensor's output is cut out
// of every rank's block (MEMCPY_OUT_FUSION_BUFFER). Bytes are only moved, never combined, so
// the outputs are the unfused ops' bytes exactly. Prediction for a group of G small tensors on
// one host: 1 collective instead of G, so 1 round of host-segment posts and waits (about
// 2 wake-ups per rank) instead of G, and 2 extra copies of bytes that are small by assumption;
// a group of large tensors gains little (the copies cost what the saved rounds do). Measured:
// benchmarks/history/RESULTS-parts-1-10.md, "Grouped allgather fused (issue #20, part 4)"; the
// current run: benchmarks/RESULTS.md, "Grouped allgather and blocking groups".
Status CpuExecutor::allgatherFused(OpContext& op) {
  const coord::Response& r = op.response;
  const int n = op.comm.size();
  const size_t me = static_cast<size_t>(op.comm.rank());
  FusedGatherLayout layout;
  HVD_RETURN_IF_ERROR(fusedAllgatherLayout(r, n, &layout));
  if (op.key_results == nullptr) {
    return common::internalError("fused allgather: no place for its outputs");
  }
  const size_t tensors = r.keys.size();
  for (size_t i = 0; i < tensors; ++i) {
    // Joined ranks never run one: coord/validation.cc (checkJoin) turns it into an error.
    if (op.entries[i] == nullptr) return common::internalError("allgather: no input tensor");
  }
  uint8_t* gathered = fusionBuffer(layout.total);
  uint8_t* mine = gathered + layout.block_offset[me];
  op.activities.start("MEMCPY_IN_FUSION_BUFFER");
  for (size_t i = 0; i < tensors; ++i) {
    const size_t part = layout.part_bytes[i * n + me];
    if (part > 0) std::memcpy(mine + layout.part_offset[i * n + me], op.entries[i]->input, part);
  }
  op.activities.end();
  op.activities.start("_ALLGATHER");
  HVD_RETURN_IF_ERROR(algo::allgather(op.comm, mine, gathered, layout.block, op.choice));
  op.activities.end();
  op.activities.start("MEMCPY_OUT_FUSION_BUFFER");
  std::vector<OpResult>& results = *op.key_results;
  results.assign(tensors, OpResult{});
  for (size_t i = 0; i < tensors; ++i) {
    results[i].buffer = hostOutput(layout.output_bytes[i]);
    results[i].shape = std::move(layout.shapes[i]);
    uint8_t* out = results[i].buffer->data;
    for (size_t k = 0; k < static_cast<size_t>(n); ++k) {
      const size_t part = layout.part_bytes[i * n + k];
      if (part == 0) continue;
      std::memcpy(out, gathered + layout.block_offset[k] + layout.part_offset[i * n + k], part);
      out += part;
    }
  }
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kAllgather), layout.total, tensors);
  return Status::ok();
}

Status CpuExecutor::allgather(OpContext& op) {
  if (op.one_round != nullptr) return oneRound(op);
  if (op.response.keys.size() > 1) return allgatherFused(op);
  const GatherLayout layout = allgatherLayout(op.response);
  const bool shared = algo::writesIntoOutputs(
      op.comm, *std::max_element(layout.bytes.begin(), layout.bytes.end()), op.choice);
  op.result->buffer = hostOutput(layout.total, shared);
  op.result->shape = layout.shape;
  const void* in = op.entries[0] != nullptr ? op.entries[0]->input : nullptr;
  op.activities.start("_ALLGATHER");
  HVD_RETURN_IF_ERROR(algo::allgather(op.comm, in, op.result->buffer->data, layout.bytes,
                                       op.choice, shared));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kAllgather), layout.total, 1);
  return Status::ok();
}

// The response carries the global root rank; algorithms use set ranks.
Status rootSetRank(const coord::Response& r, const transport::Comm& comm, int* root) {
  for (int i = 0; i < comm.size(); ++i) {
    if (comm.globalRank(i) == r.root_rank) {
      *root = i;
      return Status::ok();
    }
  }
  return common::internalError("broadcast root rank " + std::to_string(r.root_rank) +
                               " is not in the process set");
}

Status CpuExecutor::broadcast(OpContext& op) {
  if (op.one_round != nullptr) return oneRound(op);
  const coord::Response& r = op.response;
  TensorEntry* entry = op.entries[0];
  const size_t bytes = broadcastBytes(r);
  std::vector<uint8_t> scratch;
  void* data = nullptr;
  const void* in = nullptr;
  if (entry != nullptr) {
    data = entry->output;
    in = entry->input;  // read on the root only: the others' output is overwritten whole
  } else {
    scratch.resize(bytes);
    data = scratch.data();
    in = data;
  }
  int root = -1;
  HVD_RETURN_IF_ERROR(rootSetRank(r, op.comm, &root));
  op.activities.start("_BCAST");
  HVD_RETURN_IF_ERROR(algo::broadcast(op.comm, in, data, bytes, root, op.choice));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kBroadcast), bytes, 1);
  return Status::ok();
}

Status CpuExecutor::alltoall(OpContext& op) {
  if (op.one_round != nullptr) return oneRound(op);
  const AlltoallLayout layout = alltoallLayout(op.response, op.comm.rank(), op.comm.size());
  const bool shared = algo::writesIntoOutputs(op.comm, layout.largest, op.choice);
  op.result->buffer = hostOutput(layout.total, shared);
  op.result->shape = layout.shape;
  op.result->received_splits = layout.received_splits;
  const void* in = op.entries[0] != nullptr ? op.entries[0]->input : nullptr;
  op.activities.start("_ALLTOALL");
  HVD_RETURN_IF_ERROR(
      algo::alltoall(op.comm, in, layout.send, op.result->buffer->data, layout.recv,
                     layout.largest, op.choice, shared));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kAlltoall), layout.total, 1);
  return Status::ok();
}

// Note [Reducescatter scaling]: as Horovod (GlooReducescatter/MPIReducescatter::Execute), the
// prescale multiplies each rank's whole input before the sum, on a copy (the caller's input is
// never written), and the postscale (divided by the set size for Average) multiplies this
// rank's block after it. The two do not commute with the sum for integers (0.5 * 3 truncates
// to 1 on each rank before adding) nor bit for bit for floats, so neither is moved.
Status CpuExecutor::reducescatter(OpContext& op) {
  if (op.one_round != nullptr) return oneRound(op);
  const coord::Response& r = op.response;
  const int me = op.comm.rank();
  const ReducescatterLayout layout = reducescatterLayout(r, me, op.comm.size());
  const size_t elem = common::dataTypeSize(r.dtype);
  op.result->buffer = hostOutput(layout.counts[me] * elem);
  op.result->shape = layout.shape;
  void* out = op.result->buffer->data;
  // Joined ranks never run one: coord/validation.cc (checkJoin) turns it into an error.
  if (op.entries[0] == nullptr) return common::internalError("reducescatter: no input tensor");
  const void* in = op.entries[0]->input;
  if (r.prescale != 1.0) {
    uint8_t* copy = fusionBuffer(layout.input_bytes);
    if (layout.input_bytes > 0) std::memcpy(copy, in, layout.input_bytes);
    common::scaleInPlace(copy, layout.input_bytes / elem, r.dtype, r.prescale);
    op.activities.start("_REDUCESCATTER");
    HVD_RETURN_IF_ERROR(algo::reducescatter(op.comm, copy, out, layout.counts, r.dtype,
                                            r.reduce_op, op.choice, true));
  } else {
    op.activities.start("_REDUCESCATTER");
    HVD_RETURN_IF_ERROR(algo::reducescatter(op.comm, in, out, layout.counts, r.dtype,
                                            r.reduce_op, op.choice, false));
  }
  op.activities.end();
  const double post = postFactor(r, op.comm.size());
  if (post != 1.0) common::scaleInPlace(out, layout.counts[me], r.dtype, post);
  metrics_.countOp(static_cast<int>(OpType::kReducescatter), layout.input_bytes, 1);
  return Status::ok();
}

}  // namespace hvd::runtime
