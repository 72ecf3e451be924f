// The staged bodies (Note [Staged fallback] in transport/nccl/device_stream.h), in two phases
// so that the loop never blocks on the device:
//   A. inputsReady(): the op's inputs are queued for copying into the pinned host buffer, with
//      an event (and a driver callback that wakes the loop) after them; the loop leaves the
//      response at the head of its queue and goes on with everything else (messages, other
//      completions, abort) until the event has fired.
//   B. the op method: the CPU algorithm runs over shm/tcp on the host buffer exactly as for
//      host tensors (same scaling, same rounding), the result is queued for copying back, and
//      completion is deferred like any device op.
// The host buffer is reused by the next op only after its own phase A, which the stream
// orders after this op's copies back.
#include "runtime/device_staged_ops.h"

#include <cstdint>
#include <cstring>

#include "runtime/cpu_executor.h"
#include "runtime/op_layout.h"

namespace hvd::runtime {

namespace nccl = transport::nccl;
using common::Status;
using coord::OpType;

namespace {

size_t roundUp(size_t bytes) { return (bytes + 63) / 64 * 64; }

// Input and output bytes of a staged op other than allreduce (a single input per rank).
void singleInputSizes(const OpContext& op, size_t* in, size_t* out) {
  const coord::Response& r = op.response;
  const int me = op.comm.rank(), n = op.comm.size();
  *in = *out = 0;
  switch (r.type) {
    case OpType::kAllgather: {
      const GatherLayout layout = allgatherLayout(r);
      *in = layout.bytes[me];
      *out = layout.total;
      break;
    }
    case OpType::kBroadcast:
      *in = broadcastBytes(r);
      break;
    case OpType::kAlltoall: {
      const AlltoallLayout layout = alltoallLayout(r, me, n);
      for (size_t b : layout.send) *in += b;
      *out = layout.total;
      break;
    }
    case OpType::kReducescatter: {
      const ReducescatterLayout layout = reducescatterLayout(r, me, n);
      *in = layout.input_bytes;
      *out = layout.counts[me] * common::dataTypeSize(r.dtype);
      break;
    }
    default: break;
  }
}

}  // namespace

// A: allreduce packs every tensor of the batch at its offset; the others put their one input
// first and leave room for the CPU algorithm's result after it.
Status DeviceStagedOps::inputsReady(OpContext& op, DeviceStream& stream, bool* landed) {
  const coord::Response& r = op.response;
  *landed = true;
  bool held = false;
  HVD_RETURN_IF_ERROR(held_.check(op, &held, landed));
  if (held) return Status::ok();
  void* host = nullptr;
  size_t out_offset = 0;
  if (r.type == OpType::kAllreduce) {
    const size_t elem = common::dataTypeSize(r.dtype);
    HVD_RETURN_IF_ERROR(stream.hostBuffer(static_cast<size_t>(totalCount(r)) * elem, &host));
    HVD_RETURN_IF_ERROR(packInputs(op, stream, static_cast<uint8_t*>(host),
                                   /*zero_missing=*/false));
  } else {
    size_t in = 0, out = 0;
    singleInputSizes(op, &in, &out);
    HVD_RETURN_IF_ERROR(stream.hostBuffer(roundUp(in) + out, &host));
    if (op.entries[0] != nullptr) {
      HVD_RETURN_IF_ERROR(stream.copy(host, op.entries[0]->input, in));
    }
    out_offset = roundUp(in);
  }
  nccl::CudaEvent event = nullptr;
  HVD_RETURN_IF_ERROR(stream.record(&event));
  *landed = false;
  return held_.hold(op, stream, event, static_cast<uint8_t*>(host), out_offset);
}

Status DeviceStagedOps::allreduce(OpContext& op, DeviceStream& stream) {
  const coord::Response& r = op.response;
  const auto& entries = op.entries;
  const size_t elem = common::dataTypeSize(r.dtype);
  const size_t count = static_cast<size_t>(totalCount(r));
  uint8_t *base = nullptr, *unused = nullptr;
  HVD_RETURN_IF_ERROR(held_.take(&base, &unused));
  size_t offset = 0;
  for (size_t i = 0; i < r.keys.size(); ++i) {  // a joined rank's zeros
    const size_t n = static_cast<size_t>(r.counts[i]) * elem;
    if (entries[i] == nullptr && n > 0) std::memset(base + offset, 0, n);
    offset += n;
  }
  HVD_RETURN_IF_ERROR(allreduceHostBuffer(op, base, count,
                                          static_cast<size_t>(config_.tcp_segment_bytes)));
  op.activities.start("MEMCPY_HOST_TO_DEVICE");
  HVD_RETURN_IF_ERROR(unpackOutputs(op, stream, base));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kAllreduce), count * elem, r.keys.size());
  return Status::ok();
}

// B begins: the single staged input; a rank without one (it joined) contributes zeros.
Status DeviceStagedOps::stagedInput(OpContext& op, uint8_t** in, uint8_t** out) {
  HVD_RETURN_IF_ERROR(held_.take(in, out));
  if (op.entries[0] == nullptr) {
    size_t in_bytes = 0, out_bytes = 0;
    singleInputSizes(op, &in_bytes, &out_bytes);
    if (in_bytes > 0) std::memset(*in, 0, in_bytes);
  }
  return Status::ok();
}

Status DeviceStagedOps::stageOutput(OpContext& op, DeviceStream& stream, void* device,
                                    const void* host, size_t bytes) {
  op.activities.start("MEMCPY_HOST_TO_DEVICE");
  HVD_RETURN_IF_ERROR(stream.copy(device, host, bytes));
  op.activities.end();
  return Status::ok();
}

Status DeviceStagedOps::allgather(OpContext& op, DeviceStream& stream) {
  const GatherLayout layout = allgatherLayout(op.response);
  uint8_t *in = nullptr, *out = nullptr;
  HVD_RETURN_IF_ERROR(stagedInput(op, &in, &out));
  op.activities.start("STAGED_ALLGATHER");
  HVD_RETURN_IF_ERROR(algo::allgather(op.comm, in, out, layout.bytes, op.choice));
  op.activities.end();
  HVD_RETURN_IF_ERROR(deviceOutput(stream, layout.total, op.result));
  op.result->shape = layout.shape;
  HVD_RETURN_IF_ERROR(stageOutput(op, stream, op.result->buffer->data, out, layout.total));
  metrics_.countOp(static_cast<int>(OpType::kAllgather), layout.total, 1);
  return Status::ok();
}

Status DeviceStagedOps::broadcast(OpContext& op, DeviceStream& stream) {
  const coord::Response& r = op.response;
  const size_t bytes = broadcastBytes(r);
  int root = -1;
  HVD_RETURN_IF_ERROR(rootSetRank(r, op.comm, &root));
  uint8_t *data = nullptr, *unused = nullptr;
  HVD_RETURN_IF_ERROR(stagedInput(op, &data, &unused));
  op.activities.start("STAGED_BCAST");
  algo::AllreduceChoice choice = op.choice;
  choice.pinned_host_buffers = true;  // (a staging buffer: cudaMallocHost)
  HVD_RETURN_IF_ERROR(algo::broadcast(op.comm, data, data, bytes, root, choice));
  op.activities.end();
  if (op.entries[0] != nullptr) {
    HVD_RETURN_IF_ERROR(stageOutput(op, stream, op.entries[0]->output, data, bytes));
  }
  metrics_.countOp(static_cast<int>(OpType::kBroadcast), bytes, 1);
  return Status::ok();
}

Status DeviceStagedOps::alltoall(OpContext& op, DeviceStream& stream) {
  const AlltoallLayout layout = alltoallLayout(op.response, op.comm.rank(), op.comm.size());
  uint8_t *in = nullptr, *out = nullptr;
  HVD_RETURN_IF_ERROR(stagedInput(op, &in, &out));
  op.activities.start("STAGED_ALLTOALL");
  HVD_RETURN_IF_ERROR(algo::alltoall(op.comm, in, layout.send, out, layout.recv, layout.largest,
                                     op.choice));
  op.activities.end();
  HVD_RETURN_IF_ERROR(deviceOutput(stream, layout.total, op.result));
  op.result->shape = layout.shape;
  op.result->received_splits = layout.received_splits;
  HVD_RETURN_IF_ERROR(stageOutput(op, stream, op.result->buffer->data, out, layout.total));
  metrics_.countOp(static_cast<int>(OpType::kAlltoall), layout.total, 1);
  return Status::ok();
}

Status DeviceStagedOps::reducescatter(OpContext& op, DeviceStream& stream) {
  const coord::Response& r = op.response;
  const int me = op.comm.rank();
  const ReducescatterLayout layout = reducescatterLayout(r, me, op.comm.size());
  const size_t mine = layout.counts[me] * common::dataTypeSize(r.dtype);
  uint8_t *in = nullptr, *out = nullptr;
  HVD_RETURN_IF_ERROR(stagedInput(op, &in, &out));
  // Note [Reducescatter scaling] in cpu_executor.cc: the staged input is already a copy of
  // the device tensor, so it is prescaled, and reduced, in place.
  const size_t total = layout.input_bytes / common::dataTypeSize(r.dtype);
  if (r.prescale != 1.0) common::scaleInPlace(in, total, r.dtype, r.prescale);
  op.activities.start("STAGED_REDUCESCATTER");
  HVD_RETURN_IF_ERROR(algo::reducescatter(op.comm, in, out, layout.counts, r.dtype, r.reduce_op,
                                          op.choice, true));
  op.activities.end();
  const double post = postFactor(r, op.comm.size());
  if (post != 1.0) common::scaleInPlace(out, layout.counts[me], r.dtype, post);
  HVD_RETURN_IF_ERROR(deviceOutput(stream, mine, op.result));
  op.result->shape = layout.shape;
  HVD_RETURN_IF_ERROR(stageOutput(op, stream, op.result->buffer->data, out, mine));
  metrics_.countOp(static_cast<int>(OpType::kReducescatter), layout.input_bytes, 1);
  return Status::ok();
}

}  // namespace hvd::runtime
