#include "runtime/device_nccl_ops.h"

#include <cstdint>

#include "runtime/cpu_executor.h"
#include "runtime/op_layout.h"
#include "transport/nccl/loader.h"

namespace hvd::runtime {

namespace nccl = transport::nccl;
using common::Status;
using coord::OpType;

DeviceNcclOps::DeviceNcclOps(Metrics& metrics,
                             std::unique_ptr<nccl::NcclCommunicator> communicator)
    : metrics_(metrics), nccl_(std::move(communicator)) {}

// Note [Scaling without kernels] in communicator.h: what NCCL cannot reduce is staged.
bool DeviceNcclOps::stagesThroughHost(const OpContext& op) const {
  const coord::Response& r = op.response;
  if (r.type != OpType::kAllreduce && r.type != OpType::kReducescatter) return false;
  return !nccl::ncclCanReduce(*nccl::ncclApi(), r.dtype, r.reduce_op, r.prescale * r.postscale);
}

// Note [Result target]: a lone tensor goes from its input to its output; a fused batch (or a
// joined rank's zeros) through the device fusion buffer, in place.
Status DeviceNcclOps::allreduce(OpContext& op, DeviceStream& stream) {
  const coord::Response& r = op.response;
  const size_t elem = common::dataTypeSize(r.dtype);
  const size_t count = static_cast<size_t>(totalCount(r));
  const double scale = r.prescale * r.postscale;
  ResultTarget out;
  HVD_RETURN_IF_ERROR(resultTarget(op, stream, count * elem, &out));
  if (out.lone) {
    op.activities.start("NCCL_ALLREDUCE");
    HVD_RETURN_IF_ERROR(nccl_->allreduce(op.entries[0]->input, out.data, count, r.dtype,
                                         r.reduce_op, scale));
    op.activities.end();
  } else {
    op.activities.start("MEMCPY_IN_FUSION_BUFFER");
    HVD_RETURN_IF_ERROR(packInputs(op, stream, out.data, /*zero_missing=*/true));
    op.activities.end();
    op.activities.start("NCCL_ALLREDUCE");
    HVD_RETURN_IF_ERROR(nccl_->allreduce(out.data, out.data, count, r.dtype, r.reduce_op, scale));
    op.activities.end();
    op.activities.start("MEMCPY_OUT_FUSION_BUFFER");
    HVD_RETURN_IF_ERROR(unpackOutputs(op, stream, out.data));
    op.activities.end();
  }
  metrics_.countOp(static_cast<int>(OpType::kAllreduce), count * elem, r.keys.size());
  return Status::ok();
}

Status DeviceNcclOps::allgather(OpContext& op, DeviceStream& stream) {
  const GatherLayout layout = allgatherLayout(op.response);
  HVD_RETURN_IF_ERROR(deviceOutput(stream, layout.total, op.result));
  op.result->shape = layout.shape;
  const void* in = op.entries[0] != nullptr ? op.entries[0]->input : nullptr;
  op.activities.start("NCCL_ALLGATHER");
  HVD_RETURN_IF_ERROR(nccl_->allgather(in, op.result->buffer->data, layout.bytes));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kAllgather), layout.total, 1);
  return Status::ok();
}

// Note [Result target]: a joined rank receives into scratch.
Status DeviceNcclOps::broadcast(OpContext& op, DeviceStream& stream) {
  const coord::Response& r = op.response;
  const size_t bytes = broadcastBytes(r);
  ResultTarget out;
  HVD_RETURN_IF_ERROR(resultTarget(op, stream, bytes, &out));
  if (out.lone) HVD_RETURN_IF_ERROR(stream.copy(out.data, op.entries[0]->input, bytes));
  int root = -1;
  HVD_RETURN_IF_ERROR(rootSetRank(r, op.comm, &root));
  op.activities.start("NCCL_BCAST");
  HVD_RETURN_IF_ERROR(nccl_->broadcast(out.data, bytes, root));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kBroadcast), bytes, 1);
  return Status::ok();
}

Status DeviceNcclOps::alltoall(OpContext& op, DeviceStream& stream) {
  const AlltoallLayout layout = alltoallLayout(op.response, op.comm.rank(), op.comm.size());
  HVD_RETURN_IF_ERROR(deviceOutput(stream, layout.total, op.result));
  op.result->shape = layout.shape;
  op.result->received_splits = layout.received_splits;
  const void* in = op.entries[0] != nullptr ? op.entries[0]->input : nullptr;
  op.activities.start("NCCL_ALLTOALL");
  HVD_RETURN_IF_ERROR(nccl_->alltoall(in, layout.send, op.result->buffer->data, layout.recv));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kAlltoall), layout.total, 1);
  return Status::ok();
}

Status DeviceNcclOps::reducescatter(OpContext& op, DeviceStream& stream) {
  const coord::Response& r = op.response;
  const int me = op.comm.rank();
  const ReducescatterLayout layout = reducescatterLayout(r, me, op.comm.size());
  const size_t elem = common::dataTypeSize(r.dtype);
  HVD_RETURN_IF_ERROR(deviceOutput(stream, layout.counts[me] * elem, op.result));
  op.result->shape = layout.shape;
  const void* in = op.entries[0] != nullptr ? op.entries[0]->input : nullptr;
  if (in == nullptr) {  // a joined rank contributes zeros
    void* zeros = nullptr;
    HVD_RETURN_IF_ERROR(stream.deviceBuffer(layout.input_bytes, &zeros));
    HVD_RETURN_IF_ERROR(stream.zero(zeros, layout.input_bytes));
    in = zeros;
  }
  op.activities.start("NCCL_REDUCESCATTER");
  HVD_RETURN_IF_ERROR(nccl_->reducescatter(in, op.result->buffer->data, layout.counts, r.dtype,
                                           r.reduce_op, r.prescale * r.postscale));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kReducescatter), layout.input_bytes, 1);
  return Status::ok();
}

}  // namespace hvd::runtime
