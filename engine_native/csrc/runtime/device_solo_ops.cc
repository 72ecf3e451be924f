#include "runtime/device_solo_ops.h"

#include "common/logging.h"
#include "runtime/op_layout.h"
#include "transport/cuda/device_kernels.h"

namespace hvd::runtime {

namespace cuda = transport::cuda;
using common::Status;
using coord::OpType;

// Note [A world of one]
// A process set of one member (np=1, or a set of one rank inside a larger job) has no peer, so
// its CUDA collectives exchange nothing: no NCCL communicator (none is made), no IPC, no
// staging through host memory (Note [Device path choice] is skipped: the DeviceExecutor
// picks this path for any set of size 1 unless HVD_GPU_PATH=staged asks for staging or
// HVD_GPU_PATH=nccl for a one-rank communicator — how a one-GPU machine tests NCCL at all;
// HVD_GPU_PATH=ipc has nothing to do in a set of one and is not an error there).
// On the set's stream, after the inputs' producers (Note [Stream ordering]):
//   allreduce, reducescatter  output = postscale' * OP(prescale * input), where OP of one
//                             source is the identity and postscale' is postscale (Average
//                             divides by the set size, 1): per tensor of a fused batch,
//                             straight from its input to its output — a cudaMemcpyAsync when
//                             both factors are 1 (nothing at all in place), else the device
//                             reduce kernel over one source (transport/cuda/device_kernels.h),
//                             which scales bit for bit as the CPU path does (prescale, then
//                             postscale, each rounded).
//   allgather, alltoall       a core-owned output (device output pool) holding a copy of the
//                             input; alltoall's received splits are the rank's own.
//   broadcast                 output = input (a copy, nothing in place).
// Staged instead (the path that already works): Adasum; a fused allgather (its per-key
// outputs); a scaled op when the device kernel cannot be compiled here (no NVRTC or driver:
// the reason is logged once) — the CPU code scales those.
// Completion is as for every device op (Note [Deferred completion], Note [Caller waits on the
// device] in device_executor.cc).

bool DeviceSoloOps::kernelsReady() const {
  if (!kernels_ready_) {
    const Status ready = cuda::deviceKernelsReady();
    kernels_ready_ = ready.isOk();
    if (!ready.isOk()) {
      HVD_LOG(kWarning, "transport") << "a process set of one rank scales its CUDA reductions "
                                     << "through host memory (slower): " << ready.message();
    }
  }
  return *kernels_ready_;
}

bool DeviceSoloOps::stagesThroughHost(const OpContext& op) const {
  const coord::Response& r = op.response;
  if (r.type == OpType::kAllgather) return r.keys.size() > 1;
  if (r.type != OpType::kAllreduce && r.type != OpType::kReducescatter) return false;
  if (r.reduce_op == common::ReduceOp::kAdasum) return true;
  const bool scaled = r.prescale != 1.0 || postFactor(r, 1) != 1.0;
  return scaled && !kernelsReady();
}

Status DeviceSoloOps::reduceOne(const OpContext& op, DeviceStream& stream, const void* input,
                                void* output, size_t count) const {
  const coord::Response& r = op.response;
  const double post = postFactor(r, 1);
  if (r.prescale == 1.0 && post == 1.0) {  // in place: nothing
    return stream.copy(output, input, count * common::dataTypeSize(r.dtype));
  }
  if (count == 0) return Status::ok();
  const void* sources[] = {input};
  cuda::ReduceJob job{r.dtype,
                      r.reduce_op == common::ReduceOp::kAverage ? common::ReduceOp::kSum
                                                                : r.reduce_op,
                      sources, 1, output, count, r.prescale, post};
  return cuda::launchReduce(job, stream.stream());
}

Status DeviceSoloOps::allreduce(OpContext& op, DeviceStream& stream) {
  const coord::Response& r = op.response;
  for (size_t i = 0; i < r.keys.size(); ++i) {
    const TensorEntry* e = op.entries[i];
    if (e == nullptr) return common::internalError("allreduce: a set of one has no tensor");
    HVD_RETURN_IF_ERROR(reduceOne(op, stream, e->input, e->output,
                                  static_cast<size_t>(r.counts[i])));
  }
  const size_t bytes = static_cast<size_t>(totalCount(r)) * common::dataTypeSize(r.dtype);
  metrics_.countOp(static_cast<int>(OpType::kAllreduce), bytes, r.keys.size());
  return Status::ok();
}

Status DeviceSoloOps::allgather(OpContext& op, DeviceStream& stream) {
  if (op.entries[0] == nullptr) return common::internalError("allgather: no input tensor");
  const GatherLayout layout = allgatherLayout(op.response);
  HVD_RETURN_IF_ERROR(deviceOutput(stream, layout.total, op.result));
  op.result->shape = layout.shape;
  HVD_RETURN_IF_ERROR(stream.copy(op.result->buffer->data, op.entries[0]->input, layout.total));
  metrics_.countOp(static_cast<int>(OpType::kAllgather), layout.total, 1);
  return Status::ok();
}

Status DeviceSoloOps::broadcast(OpContext& op, DeviceStream& stream) {
  const TensorEntry* e = op.entries[0];
  if (e == nullptr) return common::internalError("broadcast: a set of one has no tensor");
  const size_t bytes = broadcastBytes(op.response);
  HVD_RETURN_IF_ERROR(stream.copy(e->output, e->input, bytes));  // in place: nothing
  metrics_.countOp(static_cast<int>(OpType::kBroadcast), bytes, 1);
  return Status::ok();
}

Status DeviceSoloOps::alltoall(OpContext& op, DeviceStream& stream) {
  if (op.entries[0] == nullptr) return common::internalError("alltoall: no input tensor");
  const AlltoallLayout layout = alltoallLayout(op.response, 0, 1);
  HVD_RETURN_IF_ERROR(deviceOutput(stream, layout.total, op.result));
  op.result->shape = layout.shape;
  op.result->received_splits = layout.received_splits;
  HVD_RETURN_IF_ERROR(stream.copy(op.result->buffer->data, op.entries[0]->input, layout.total));
  metrics_.countOp(static_cast<int>(OpType::kAlltoall), layout.total, 1);
  return Status::ok();
}

Status DeviceSoloOps::reducescatter(OpContext& op, DeviceStream& stream) {
  const coord::Response& r = op.response;
  if (op.entries[0] == nullptr) return common::internalError("reducescatter: no input tensor");
  const ReducescatterLayout layout = reducescatterLayout(r, 0, 1);
  HVD_RETURN_IF_ERROR(
      deviceOutput(stream, layout.counts[0] * common::dataTypeSize(r.dtype), op.result));
  op.result->shape = layout.shape;
  HVD_RETURN_IF_ERROR(reduceOne(op, stream, op.entries[0]->input, op.result->buffer->data,
                                layout.counts[0]));
  metrics_.countOp(static_cast<int>(OpType::kReducescatter), layout.input_bytes, 1);
  return Status::ok();
}

}  // namespace hvd::runtime
