#include "runtime/device_ipc_ops.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "runtime/cpu_executor.h"
#include "runtime/op_layout.h"

namespace hvd::runtime {

using common::Status;
using coord::OpType;
using transport::nccl::DeviceStream;

namespace {

std::vector<size_t> offsets(const std::vector<size_t>& sizes) {
  std::vector<size_t> out(sizes.size(), 0);
  for (size_t i = 1; i < sizes.size(); ++i) out[i] = out[i - 1] + sizes[i - 1];
  return out;
}

// Note [IPC output after the drain]: a pooled output block may come with a device wait for its
// last users, recorded on the caller's stream behind queued training kernels; taken before a
// host-ordered op's first step, that wait would sit inside the step's host wait. So the ops
// take their output in their first read, after it (or after the steps, when there were none).
Status lateOutput(DeviceStream& stream, size_t bytes, OpResult* result, uint8_t** out) {
  if (*out != nullptr || result->buffer != nullptr) return Status::ok();
  HVD_RETURN_IF_ERROR(deviceOutput(stream, bytes, result));
  *out = static_cast<uint8_t*>(result->buffer->data);
  return Status::ok();
}

}  // namespace

DeviceIpcOps::DeviceIpcOps(Metrics& metrics, const common::Config& config, DeviceHeldOp& held,
                           std::unique_ptr<transport::cuda::IpcPeers> peers)
    : metrics_(metrics), held_(held), steps_(config, std::move(peers)) {}

bool DeviceIpcOps::stagesThroughHost(const OpContext& op) const {
  const coord::Response& r = op.response;
  const bool reduction = r.type == OpType::kAllreduce || r.type == OpType::kReducescatter;
  return reduction && r.reduce_op == common::ReduceOp::kAdasum;
}

// The host-ordered protocol's phase A (Note [IPC step protocol]): the op runs once every
// input's producer finished, so that its steps' host waits are bounded by the core's own
// copies and kernels. Ready at once when the stream is already idle; else the loop goes on
// with other work until the driver wakes it past the producers.
Status DeviceIpcOps::inputsReady(OpContext& op, DeviceStream& stream, bool* ready) {
  *ready = true;
  if (!steps_.hostOrdered()) return Status::ok();
  bool held = false;
  HVD_RETURN_IF_ERROR(held_.check(op, &held, ready));
  if (held) return Status::ok();
  transport::nccl::CudaEvent event = nullptr;
  HVD_RETURN_IF_ERROR(stream.record(&event));
  bool finished = false;
  Status status = stream.query(event, &finished);
  if (!status.isOk() || finished) {
    stream.release(event);
    *ready = status.isOk();
    return status;
  }
  *ready = false;
  return held_.hold(op, stream, event, /*host=*/nullptr, /*out_offset=*/0);
}

Status DeviceIpcOps::steps(OpContext& op, DeviceStream& stream, size_t span,
                           const DeviceIpcSteps::Write& write, const DeviceIpcSteps::Read& read) {
  if (steps_.hostOrdered()) held_.release();  // the producers finished: inputsReady()
  return steps_.run(op.comm, stream, span, write, read);
}

// Note [Result target]. Spans as NCCL's: a fused batch's packing is MEMCPY_IN_FUSION_BUFFER
// (once per step).
Status DeviceIpcOps::allreduce(OpContext& op, DeviceStream& stream) {
  const coord::Response& r = op.response;
  const size_t bytes = static_cast<size_t>(totalCount(r)) * common::dataTypeSize(r.dtype);
  ResultTarget out;
  HVD_RETURN_IF_ERROR(resultTarget(op, stream, bytes, &out));
  const bool lone = out.lone;
  if (lone) op.activities.start("CUDA_IPC_ALLREDUCE");
  HVD_RETURN_IF_ERROR(steps(
      op, stream, bytes,
      [&](uint8_t* mine, size_t lo, size_t n) {
        if (lone) return packWindow(op, stream, mine, lo, n);
        op.activities.start("MEMCPY_IN_FUSION_BUFFER");
        Status packed = packWindow(op, stream, mine, lo, n);
        op.activities.end();
        op.activities.start("CUDA_IPC_ALLREDUCE");  // the barrier, the waits, the reduction
        return packed;
      },
      [&](int slot, size_t lo, size_t n) {
        Status reduced = steps_.reduce(r, stream, slot, 0, out.data + lo, n,
                                       postFactor(r, op.comm.size()));
        if (!lone) op.activities.end();
        return reduced;
      }));
  if (lone) op.activities.end();
  if (!lone) {
    op.activities.start("MEMCPY_OUT_FUSION_BUFFER");
    HVD_RETURN_IF_ERROR(unpackOutputs(op, stream, out.data));
    op.activities.end();
  }
  metrics_.countOp(static_cast<int>(OpType::kAllreduce), bytes, r.keys.size());
  return Status::ok();
}

Status DeviceIpcOps::reducescatter(OpContext& op, DeviceStream& stream) {
  const coord::Response& r = op.response;
  const int me = op.comm.rank();
  const ReducescatterLayout layout = reducescatterLayout(r, me, op.comm.size());
  const size_t elem = common::dataTypeSize(r.dtype);
  std::vector<size_t> shard_bytes;
  for (size_t c : layout.counts) shard_bytes.push_back(c * elem);
  const size_t mine_at = offsets(shard_bytes)[me], mine_bytes = shard_bytes[me];
  uint8_t* out = nullptr;  // Note [IPC output after the drain]
  const auto* in = op.entries[0] != nullptr ? static_cast<const uint8_t*>(op.entries[0]->input)
                                            : nullptr;  // a joined rank contributes zeros
  op.activities.start("CUDA_IPC_REDUCESCATTER");
  HVD_RETURN_IF_ERROR(steps(
      op, stream, layout.input_bytes,
      [&](uint8_t* slot, size_t lo, size_t n) {
        return in != nullptr ? stream.copy(slot, in + lo, n) : stream.zero(slot, n);
      },
      [&](int slot, size_t lo, size_t n) {
        HVD_RETURN_IF_ERROR(lateOutput(stream, mine_bytes, op.result, &out));
        const auto [start, length] = overlap(mine_at, mine_bytes, lo, n);
        return steps_.reduce(r, stream, slot, start - lo, out + (start - mine_at), length,
                             postFactor(r, op.comm.size()));
      }));
  HVD_RETURN_IF_ERROR(lateOutput(stream, mine_bytes, op.result, &out));
  op.result->shape = layout.shape;
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kReducescatter), layout.input_bytes, 1);
  return Status::ok();
}

Status DeviceIpcOps::allgather(OpContext& op, DeviceStream& stream) {
  const GatherLayout layout = allgatherLayout(op.response);
  uint8_t* out = nullptr;  // Note [IPC output after the drain]
  const std::vector<size_t> at = offsets(layout.bytes);
  const size_t span = *std::max_element(layout.bytes.begin(), layout.bytes.end());
  const int me = op.comm.rank();
  const auto* in = op.entries[0] != nullptr ? static_cast<const uint8_t*>(op.entries[0]->input)
                                            : nullptr;
  op.activities.start("CUDA_IPC_ALLGATHER");
  HVD_RETURN_IF_ERROR(steps(
      op, stream, span,
      [&](uint8_t* slot, size_t lo, size_t n) {
        const size_t length = overlap(0, layout.bytes[me], lo, n).second;
        return length > 0 ? stream.copy(slot, in + lo, length) : Status::ok();
      },
      [&](int slot, size_t lo, size_t n) {
        HVD_RETURN_IF_ERROR(lateOutput(stream, layout.total, op.result, &out));
        for (int m = 0; m < op.comm.size(); ++m) {
          const size_t length = overlap(0, layout.bytes[m], lo, n).second;
          if (length > 0) {
            HVD_RETURN_IF_ERROR(
                stream.copy(out + at[m] + lo, steps_.peers().slot(m, slot), length));
          }
        }
        return Status::ok();
      }));
  HVD_RETURN_IF_ERROR(lateOutput(stream, layout.total, op.result, &out));
  op.result->shape = layout.shape;
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kAllgather), layout.total, 1);
  return Status::ok();
}

// Note [Result target]: a joined rank receives into scratch.
Status DeviceIpcOps::broadcast(OpContext& op, DeviceStream& stream) {
  const coord::Response& r = op.response;
  const size_t bytes = broadcastBytes(r);
  int root = -1;
  HVD_RETURN_IF_ERROR(rootSetRank(r, op.comm, &root));
  const bool is_root = op.comm.rank() == root;
  ResultTarget out;
  HVD_RETURN_IF_ERROR(resultTarget(op, stream, bytes, &out));
  if (out.lone && is_root) {
    HVD_RETURN_IF_ERROR(stream.copy(out.data, op.entries[0]->input, bytes));
  }
  op.activities.start("CUDA_IPC_BCAST");
  HVD_RETURN_IF_ERROR(steps(
      op, stream, bytes,
      [&](uint8_t* slot, size_t lo, size_t n) {
        return is_root ? stream.copy(slot, out.data + lo, n) : Status::ok();
      },
      [&](int slot, size_t lo, size_t n) {
        return is_root ? Status::ok()
                       : stream.copy(out.data + lo, steps_.peers().slot(root, slot), n);
      }));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kBroadcast), bytes, 1);
  return Status::ok();
}

// Member m's input holds its block for each member t at send offset t; this rank copies, from
// every member's window, the part of the block meant for it.
Status DeviceIpcOps::alltoall(OpContext& op, DeviceStream& stream) {
  const int me = op.comm.rank(), n_members = op.comm.size();
  const AlltoallLayout mine = alltoallLayout(op.response, me, n_members);
  uint8_t* out = nullptr;  // Note [IPC output after the drain]
  const std::vector<size_t> recv_at = offsets(mine.recv);
  std::vector<size_t> block_at(n_members), input_bytes(n_members);  // in member m's input
  for (int m = 0; m < n_members; ++m) {
    const AlltoallLayout theirs = alltoallLayout(op.response, m, n_members);
    block_at[m] = offsets(theirs.send)[me];
    input_bytes[m] = 0;
    for (size_t b : theirs.send) input_bytes[m] += b;
  }
  const size_t span = *std::max_element(input_bytes.begin(), input_bytes.end());
  const auto* in = op.entries[0] != nullptr ? static_cast<const uint8_t*>(op.entries[0]->input)
                                            : nullptr;
  op.activities.start("CUDA_IPC_ALLTOALL");
  HVD_RETURN_IF_ERROR(steps(
      op, stream, span,
      [&](uint8_t* slot, size_t lo, size_t n) {
        const size_t length = overlap(0, input_bytes[me], lo, n).second;
        return length > 0 ? stream.copy(slot, in + lo, length) : Status::ok();
      },
      [&](int slot, size_t lo, size_t n) {
        HVD_RETURN_IF_ERROR(lateOutput(stream, mine.total, op.result, &out));
        for (int m = 0; m < n_members; ++m) {
          const auto [start, length] = overlap(block_at[m], mine.recv[m], lo, n);
          if (length == 0) continue;
          HVD_RETURN_IF_ERROR(stream.copy(out + recv_at[m] + (start - block_at[m]),
                                          steps_.peers().slot(m, slot) + (start - lo), length));
        }
        return Status::ok();
      }));
  HVD_RETURN_IF_ERROR(lateOutput(stream, mine.total, op.result, &out));
  op.result->shape = mine.shape;
  op.result->received_splits = mine.received_splits;
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kAlltoall), mine.total, 1);
  return Status::ok();
}

}  // namespace hvd::runtime
