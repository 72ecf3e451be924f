// DeviceExecutor's collectives on CUDA tensors: each op method picks NCCL, CUDA IPC or the
// staged path (device_executor.h), and the NCCL bodies live here (IPC: device_ipc_ops.cc). Every call only queues work on the
// device stream; nothing here waits for the device.
#include <cstdint>

#include "runtime/cpu_executor.h"
#include "runtime/device_executor.h"
#include "runtime/op_layout.h"

namespace hvd::runtime {

using common::Status;
using coord::OpType;

Status DeviceExecutor::allreduce(OpContext& op) {
  if (stagesThroughHost(op)) return stagedAllreduce(op);
  if (current_.set->path == Path::kMixed) return mixedAllreduce(op);
  return current_.set->path == Path::kIpc ? ipcAllreduce(op) : ncclAllreduce(op);
}

Status DeviceExecutor::allgather(OpContext& op) {
  if (stagesThroughHost(op)) return stagedAllgather(op);
  return current_.set->path == Path::kIpc ? ipcAllgather(op) : ncclAllgather(op);
}

Status DeviceExecutor::broadcast(OpContext& op) {
  if (stagesThroughHost(op)) return stagedBroadcast(op);
  return current_.set->path == Path::kIpc ? ipcBroadcast(op) : ncclBroadcast(op);
}

Status DeviceExecutor::alltoall(OpContext& op) {
  if (stagesThroughHost(op)) return stagedAlltoall(op);
  return current_.set->path == Path::kIpc ? ipcAlltoall(op) : ncclAlltoall(op);
}

Status DeviceExecutor::reducescatter(OpContext& op) {
  if (stagesThroughHost(op)) return stagedReducescatter(op);
  return current_.set->path == Path::kIpc ? ipcReducescatter(op) : ncclReducescatter(op);
}

// A batch's tensors to their offsets of a packed buffer (device or pinned host memory), in
// response order; a joined rank's slots are zeroed on the stream when `zero_missing`.
Status DeviceExecutor::packInputs(const OpContext& op, uint8_t* base, bool zero_missing) {
  const coord::Response& r = op.response;
  const size_t elem = common::dataTypeSize(r.dtype);
  size_t offset = 0;
  for (size_t i = 0; i < r.keys.size(); ++i) {
    const size_t n = static_cast<size_t>(r.counts[i]) * elem;
    if (op.entries[i] != nullptr) {
      HVD_RETURN_IF_ERROR(stream().copy(base + offset, op.entries[i]->input, n));
    } else if (zero_missing) {
      HVD_RETURN_IF_ERROR(stream().zero(base + offset, n));
    }
    offset += n;
  }
  return Status::ok();
}

// The reverse: every tensor of the batch this rank has gets its slot of the packed result.
Status DeviceExecutor::unpackOutputs(const OpContext& op, const uint8_t* base) {
  const coord::Response& r = op.response;
  const size_t elem = common::dataTypeSize(r.dtype);
  size_t offset = 0;
  for (size_t i = 0; i < r.keys.size(); ++i) {
    const size_t n = static_cast<size_t>(r.counts[i]) * elem;
    if (op.entries[i] != nullptr) {
      HVD_RETURN_IF_ERROR(stream().copy(op.entries[i]->output, base + offset, n));
    }
    offset += n;
  }
  return Status::ok();
}

// A lone tensor goes from its input to its output; a fused batch (or a joined rank's zeros)
// through the device fusion buffer, in place.
Status DeviceExecutor::ncclAllreduce(OpContext& op) {
  const coord::Response& r = op.response;
  const auto& entries = op.entries;
  const size_t elem = common::dataTypeSize(r.dtype);
  const size_t count = static_cast<size_t>(totalCount(r));
  const double scale = r.prescale * r.postscale;
  if (r.keys.size() == 1 && entries[0] != nullptr) {
    op.activities.start("NCCL_ALLREDUCE");
    HVD_RETURN_IF_ERROR(nccl().allreduce(entries[0]->input, entries[0]->output, count, r.dtype,
                                         r.reduce_op, scale));
    op.activities.end();
  } else {
    void* buffer = nullptr;
    HVD_RETURN_IF_ERROR(stream().deviceBuffer(count * elem, &buffer));
    auto* base = static_cast<uint8_t*>(buffer);
    op.activities.start("MEMCPY_IN_FUSION_BUFFER");
    HVD_RETURN_IF_ERROR(packInputs(op, base, /*zero_missing=*/true));
    op.activities.end();
    op.activities.start("NCCL_ALLREDUCE");
    HVD_RETURN_IF_ERROR(nccl().allreduce(base, base, count, r.dtype, r.reduce_op, scale));
    op.activities.end();
    op.activities.start("MEMCPY_OUT_FUSION_BUFFER");
    HVD_RETURN_IF_ERROR(unpackOutputs(op, base));
    op.activities.end();
  }
  metrics_.countOp(static_cast<int>(OpType::kAllreduce), count * elem, r.keys.size());
  return Status::ok();
}

Status DeviceExecutor::ncclAllgather(OpContext& op) {
  const GatherLayout layout = allgatherLayout(op.response);
  HVD_RETURN_IF_ERROR(deviceOutput(layout.total, op.result));
  op.result->shape = layout.shape;
  const void* in = op.entries[0] != nullptr ? op.entries[0]->input : nullptr;
  op.activities.start("NCCL_ALLGATHER");
  HVD_RETURN_IF_ERROR(nccl().allgather(in, op.result->buffer->data, layout.bytes));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kAllgather), layout.total, 1);
  return Status::ok();
}

Status DeviceExecutor::ncclBroadcast(OpContext& op) {
  const coord::Response& r = op.response;
  TensorEntry* entry = op.entries[0];
  const size_t bytes = static_cast<size_t>(r.counts.empty() ? 0 : r.counts[0]) *
                       common::dataTypeSize(r.dtype);
  void* data = nullptr;
  if (entry != nullptr) {
    data = entry->output;
    HVD_RETURN_IF_ERROR(stream().copy(data, entry->input, bytes));
  } else {
    HVD_RETURN_IF_ERROR(stream().deviceBuffer(bytes, &data));  // a joined rank's scratch
  }
  int root = -1;
  HVD_RETURN_IF_ERROR(rootSetRank(r, op.comm, &root));
  op.activities.start("NCCL_BCAST");
  HVD_RETURN_IF_ERROR(nccl().broadcast(data, bytes, root));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kBroadcast), bytes, 1);
  return Status::ok();
}

Status DeviceExecutor::ncclAlltoall(OpContext& op) {
  const AlltoallLayout layout = alltoallLayout(op.response, op.comm.rank(), op.comm.size());
  HVD_RETURN_IF_ERROR(deviceOutput(layout.total, op.result));
  op.result->shape = layout.shape;
  op.result->received_splits = layout.received_splits;
  const void* in = op.entries[0] != nullptr ? op.entries[0]->input : nullptr;
  op.activities.start("NCCL_ALLTOALL");
  HVD_RETURN_IF_ERROR(
      nccl().alltoall(in, layout.send, op.result->buffer->data, layout.recv));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kAlltoall), layout.total, 1);
  return Status::ok();
}

Status DeviceExecutor::ncclReducescatter(OpContext& op) {
  const coord::Response& r = op.response;
  const int me = op.comm.rank();
  const ReducescatterLayout layout = reducescatterLayout(r, me, op.comm.size());
  const size_t elem = common::dataTypeSize(r.dtype);
  HVD_RETURN_IF_ERROR(deviceOutput(layout.counts[me] * elem, op.result));
  op.result->shape = layout.shape;
  const void* in = op.entries[0] != nullptr ? op.entries[0]->input : nullptr;
  if (in == nullptr) {  // a joined rank contributes zeros
    void* zeros = nullptr;
    HVD_RETURN_IF_ERROR(stream().deviceBuffer(layout.input_bytes, &zeros));
    HVD_RETURN_IF_ERROR(stream().zero(zeros, layout.input_bytes));
    in = zeros;
  }
  op.activities.start("NCCL_REDUCESCATTER");
  HVD_RETURN_IF_ERROR(nccl().reducescatter(in, op.result->buffer->data, layout.counts, r.dtype,
                                           r.reduce_op, r.prescale * r.postscale));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kReducescatter), layout.input_bytes, 1);
  return Status::ok();
}

}  // namespace hvd::runtime
