// DeviceExecutor's staged bodies (Note [Staged fallback] in transport/nccl/device_stream.h):
// the inputs are copied into the pinned host buffer, the stream is waited for (the one host
// wait of this path: the CPU algorithm needs the bytes), the CPU algorithm runs over shm/tcp
// exactly as for host tensors (same scaling, same rounding), and the result is copied back to
// the device; completion is deferred like any device op. The host buffer is reused by the
// next op only after its own wait, which follows this op's copies back on the stream.
#include <cstdint>
#include <cstring>

#include "runtime/cpu_executor.h"
#include "runtime/device_executor.h"
#include "runtime/op_layout.h"

namespace hvd::runtime {

using common::Status;
using coord::OpType;

namespace {

size_t roundUp(size_t bytes) { return (bytes + 63) / 64 * 64; }

}  // namespace

Status DeviceExecutor::stagedAllreduce(OpContext& op) {
  const coord::Response& r = op.response;
  const auto& entries = op.entries;
  const size_t elem = common::dataTypeSize(r.dtype);
  const size_t count = static_cast<size_t>(totalCount(r));
  void* host = nullptr;
  HVD_RETURN_IF_ERROR(stream().hostBuffer(count * elem, &host));
  auto* base = static_cast<uint8_t*>(host);
  op.activities.start("MEMCPY_DEVICE_TO_HOST");
  size_t offset = 0;
  for (size_t i = 0; i < r.keys.size(); ++i) {
    const size_t n = static_cast<size_t>(r.counts[i]) * elem;
    if (entries[i] != nullptr) HVD_RETURN_IF_ERROR(stream().copy(base + offset, entries[i]->input, n));
    offset += n;
  }
  HVD_RETURN_IF_ERROR(stream().synchronize());
  op.activities.end();
  offset = 0;
  for (size_t i = 0; i < r.keys.size(); ++i) {  // a joined rank's zeros, after the wait
    const size_t n = static_cast<size_t>(r.counts[i]) * elem;
    if (entries[i] == nullptr && n > 0) std::memset(base + offset, 0, n);
    offset += n;
  }
  HVD_RETURN_IF_ERROR(allreduceHostBuffer(op, base, count,
                                          static_cast<size_t>(config_.tcp_segment_bytes)));
  op.activities.start("MEMCPY_HOST_TO_DEVICE");
  offset = 0;
  for (size_t i = 0; i < r.keys.size(); ++i) {
    const size_t n = static_cast<size_t>(r.counts[i]) * elem;
    if (entries[i] != nullptr) HVD_RETURN_IF_ERROR(stream().copy(entries[i]->output, base + offset, n));
    offset += n;
  }
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kAllreduce), count * elem, r.keys.size());
  return Status::ok();
}

// The op's single input (of in_bytes) to the front of the host buffer, then the wait; the
// `out_bytes` after it are free for the CPU algorithm's result.
Status DeviceExecutor::stageInput(OpContext& op, size_t in_bytes, size_t out_bytes,
                                  uint8_t** host_in, uint8_t** host_out) {
  void* host = nullptr;
  HVD_RETURN_IF_ERROR(stream().hostBuffer(roundUp(in_bytes) + out_bytes, &host));
  *host_in = static_cast<uint8_t*>(host);
  *host_out = *host_in + roundUp(in_bytes);
  op.activities.start("MEMCPY_DEVICE_TO_HOST");
  if (op.entries[0] != nullptr) {
    HVD_RETURN_IF_ERROR(stream().copy(*host_in, op.entries[0]->input, in_bytes));
  }
  HVD_RETURN_IF_ERROR(stream().synchronize());
  op.activities.end();
  if (op.entries[0] == nullptr && in_bytes > 0) std::memset(*host_in, 0, in_bytes);
  return Status::ok();
}

Status DeviceExecutor::stageOutput(OpContext& op, void* device, const void* host, size_t bytes) {
  op.activities.start("MEMCPY_HOST_TO_DEVICE");
  HVD_RETURN_IF_ERROR(stream().copy(device, host, bytes));
  op.activities.end();
  return Status::ok();
}

Status DeviceExecutor::stagedAllgather(OpContext& op) {
  const GatherLayout layout = allgatherLayout(op.response);
  const size_t mine = layout.bytes[op.comm.rank()];
  uint8_t *in = nullptr, *out = nullptr;
  HVD_RETURN_IF_ERROR(stageInput(op, mine, layout.total, &in, &out));
  op.activities.start("STAGED_ALLGATHER");
  HVD_RETURN_IF_ERROR(algo::allgatherRing(op.comm, in, out, layout.bytes));
  op.activities.end();
  HVD_RETURN_IF_ERROR(deviceOutput(layout.total, op.result));
  op.result->shape = layout.shape;
  HVD_RETURN_IF_ERROR(stageOutput(op, op.result->buffer->data, out, layout.total));
  metrics_.countOp(static_cast<int>(OpType::kAllgather), layout.total, 1);
  return Status::ok();
}

Status DeviceExecutor::stagedBroadcast(OpContext& op) {
  const coord::Response& r = op.response;
  const size_t bytes = static_cast<size_t>(r.counts.empty() ? 0 : r.counts[0]) *
                       common::dataTypeSize(r.dtype);
  int root = -1;
  HVD_RETURN_IF_ERROR(rootSetRank(r, op.comm, &root));
  uint8_t *data = nullptr, *unused = nullptr;
  HVD_RETURN_IF_ERROR(stageInput(op, bytes, 0, &data, &unused));
  op.activities.start("STAGED_BCAST");
  HVD_RETURN_IF_ERROR(algo::broadcastTree(op.comm, data, bytes, root));
  op.activities.end();
  if (op.entries[0] != nullptr) {
    HVD_RETURN_IF_ERROR(stageOutput(op, op.entries[0]->output, data, bytes));
  }
  metrics_.countOp(static_cast<int>(OpType::kBroadcast), bytes, 1);
  return Status::ok();
}

Status DeviceExecutor::stagedAlltoall(OpContext& op) {
  const AlltoallLayout layout = alltoallLayout(op.response, op.comm.rank(), op.comm.size());
  size_t sent = 0;
  for (size_t b : layout.send) sent += b;
  uint8_t *in = nullptr, *out = nullptr;
  HVD_RETURN_IF_ERROR(stageInput(op, sent, layout.total, &in, &out));
  op.activities.start("STAGED_ALLTOALL");
  HVD_RETURN_IF_ERROR(algo::alltoallPairwise(op.comm, in, layout.send, out, layout.recv));
  op.activities.end();
  HVD_RETURN_IF_ERROR(deviceOutput(layout.total, op.result));
  op.result->shape = layout.shape;
  op.result->received_splits = layout.received_splits;
  HVD_RETURN_IF_ERROR(stageOutput(op, op.result->buffer->data, out, layout.total));
  metrics_.countOp(static_cast<int>(OpType::kAlltoall), layout.total, 1);
  return Status::ok();
}

Status DeviceExecutor::stagedReducescatter(OpContext& op) {
  const coord::Response& r = op.response;
  const int me = op.comm.rank();
  const ReducescatterLayout layout = reducescatterLayout(r, me, op.comm.size());
  const size_t elem = common::dataTypeSize(r.dtype);
  const size_t mine = layout.counts[me] * elem;
  uint8_t *in = nullptr, *out = nullptr;
  HVD_RETURN_IF_ERROR(stageInput(op, layout.input_bytes, mine, &in, &out));
  op.activities.start("STAGED_REDUCESCATTER");
  HVD_RETURN_IF_ERROR(
      algo::reducescatterRing(op.comm, in, out, layout.counts, r.dtype, r.reduce_op));
  op.activities.end();
  // As CpuExecutor: scaling commutes with the sum, applied to this rank's block only.
  const double factor = r.prescale * postFactor(r, op.comm.size());
  if (factor != 1.0) common::scaleInPlace(out, layout.counts[me], r.dtype, factor);
  HVD_RETURN_IF_ERROR(deviceOutput(mine, op.result));
  op.result->shape = layout.shape;
  HVD_RETURN_IF_ERROR(stageOutput(op, op.result->buffer->data, out, mine));
  metrics_.countOp(static_cast<int>(OpType::kReducescatter), layout.input_bytes, 1);
  return Status::ok();
}

}  // namespace hvd::runtime
