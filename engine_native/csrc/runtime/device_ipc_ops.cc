// DeviceExecutor's collectives over CUDA IPC, for a process set whose ranks all share one GPU
// (Note [Device path choice] in device_path.cc). Every member's staging buffer is mapped in
// every other member; each op runs as steps of Note [IPC step protocol]
// (transport/cuda/ipc_peers.cc): write my input window into my slot, one host barrier, then
// read the members' slots on the device — copies for allgather, broadcast and alltoall, the
// device reduction (transport/cuda/device_kernels.h) for allreduce and reducescatter. Every
// call only queues work on this rank's stream; completion is deferred like the other paths.
//
// Note [IPC slot size]: slots start at 1 MiB and grow (to a power of two, at most
// kMaxIpcSlotBytes) at the first op that needs more; an op larger than the largest slot runs
// as several steps (chunks), one host barrier each. Growing re-runs the handle exchange
// (connectIpc), which is collective: `span` — the largest member's input — is computed from
// the response alone, so every member grows at the same op. Before its buffer is freed each
// member waits for its stream (its reads of the peers' slots are done), a barrier (so are
// everyone's reads of its slot), closes its imports, and a second barrier (no peer maps its
// buffer any more; Note [IPC teardown] in ipc_peers.cc): the one place this path blocks the
// host on the device, at most a handful of times per process.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

#include "algo/algorithms.h"
#include "runtime/cpu_executor.h"
#include "runtime/device_executor.h"
#include "runtime/device_path.h"
#include "runtime/op_layout.h"
#include "transport/cuda/device_kernels.h"
#include "transport/mesh.h"

namespace hvd::runtime {

using common::Status;
using coord::OpType;
namespace cuda = transport::cuda;

namespace {

constexpr size_t kMaxIpcSlotBytes = size_t{64} << 20;
// A step's own copy takes microseconds: poll that long before sleeping (Note [IPC step
// protocol], host-ordered). Bounded, and yielding: ranks may outnumber the cores.
constexpr int kIpcStepSpinMicroseconds = 200;

size_t slotFor(size_t span) {
  size_t bytes = size_t{1} << 20;
  while (bytes < span && bytes < kMaxIpcSlotBytes) bytes <<= 1;
  return bytes;
}

// [a, a + an) ∩ [b, b + bn) as (start, length); length 0 when they do not meet.
std::pair<size_t, size_t> overlap(size_t a, size_t an, size_t b, size_t bn) {
  const size_t lo = std::max(a, b), hi = std::min(a + an, b + bn);
  return hi > lo ? std::pair{lo, hi - lo} : std::pair{lo, size_t{0}};
}

std::vector<size_t> offsets(const std::vector<size_t>& sizes) {
  std::vector<size_t> out(sizes.size(), 0);
  for (size_t i = 1; i < sizes.size(); ++i) out[i] = out[i - 1] + sizes[i - 1];
  return out;
}

}  // namespace

// Note [IPC slot size].
Status DeviceExecutor::ipcReserve(OpContext& op, size_t span) {
  const size_t want = slotFor(span);
  if (want <= ipc().slotBytes()) return Status::ok();
  transport::Comm& comm = ipcComm(op);
  // Bounded: device-ordered, the stream may wait for a peer's event, or run behind a producer
  // kernel that never ends; an unbounded synchronize() there would outlive abort().
  HVD_RETURN_IF_ERROR(waitForOwnStream(comm, "the reads of the old slots queued before growing "
                                             "them"));
  HVD_RETURN_IF_ERROR(algo::barrier(comm));  // every member's reads are done
  ipc().closeImported();
  HVD_RETURN_IF_ERROR(algo::barrier(comm));  // no member maps this rank's buffer any more
  const bool host_ordered = ipc().hostOrdered();  // the set's agreed protocol stays
  ipc().freeOwn();                                 // Note [IPC teardown]
  current_.set->ipc.reset();
  std::string why;
  HVD_RETURN_IF_ERROR(connectIpc(comm, stream(), want, host_ordered, &current_.set->ipc, &why));
  if (current_.set->ipc == nullptr) {
    return common::internalError("CUDA IPC: growing the staging buffers to " +
                                 std::to_string(want) + " bytes failed: " + why);
  }
  current_.set->ipc_steps = 0;          // fresh events: nothing recorded yet
  current_.set->ipc_last_drained = true;  // and every member's reads are done (the barrier)
  return Status::ok();
}

// The host-ordered protocol's phase A (Note [IPC step protocol]): the op runs once every
// input's producer finished, so that its steps' host waits are bounded by the core's own
// copies and kernels. Ready at once when the stream is already idle; else the loop goes on
// with other work until the driver wakes it past the producers.
Status DeviceExecutor::awaitProducers(OpContext& op, bool* ready) {
  bool queued = false;
  HVD_RETURN_IF_ERROR(phaseAQueued(op, &queued, ready));
  if (queued) return Status::ok();
  transport::nccl::CudaEvent event = nullptr;
  HVD_RETURN_IF_ERROR(stream().record(&event));
  bool finished = false;
  Status status = stream().query(event, &finished);
  if (!status.isOk() || finished) {
    stream().release(event);
    *ready = status.isOk();
    return status;
  }
  *ready = false;
  return holdPhaseA(op, event, nullptr);
}

void DeviceExecutor::dropPhaseA() {
  if (!staging_.queued) return;
  staging_.stream->release(staging_.event);
  staging_ = Staging();
}

// Note [IPC step protocol], over the windows of `span` bytes: (a)-(d) with interprocess events
// on the device; host-ordered, the op's first step is drained instead.
Status DeviceExecutor::ipcSteps(OpContext& op, size_t span, const IpcWrite& write,
                                const IpcRead& read) {
  const bool host_ordered = ipc().hostOrdered();
  if (host_ordered) dropPhaseA();      // the producers finished: awaitProducers()
  if (span == 0) return Status::ok();  // every member has nothing: the same everywhere
  HVD_RETURN_IF_ERROR(ipcReserve(op, span));
  const size_t window = ipc().slotBytes();
  transport::Comm& comm = ipcComm(op);
  for (size_t lo = 0; lo < span; lo += window) {
    const size_t n = std::min(window, span - lo);
    const int slot = static_cast<int>(current_.set->ipc_steps++ % cuda::kIpcSlots);
    const bool drained = host_ordered && lo == 0;  // the same on every member
    if (!current_.set->ipc_last_drained) {
      HVD_RETURN_IF_ERROR(ipc().waitPeersReadsDone(slot));  // (a)
    }
    HVD_RETURN_IF_ERROR(write(ipc().slot(comm.rank(), slot), lo, n));  // (b)
    if (drained) HVD_RETURN_IF_ERROR(waitForOwnStream(comm, "this rank's copy into its slot"));
    HVD_RETURN_IF_ERROR(ipc().recordInputReady(slot));
    HVD_RETURN_IF_ERROR(algo::barrier(comm));  // (c)
    if (!drained) HVD_RETURN_IF_ERROR(ipc().waitPeersInputReady(slot));
    HVD_RETURN_IF_ERROR(read(slot, lo, n));  // (d)
    HVD_RETURN_IF_ERROR(ipc().recordReadsDone(slot));
    current_.set->ipc_last_drained = drained;
  }
  return Status::ok();
}

// The host-ordered step's wait: the producers finished in phase A, so what is queued is this
// rank's own copies and kernels — and, after a chunked op, its device wait for the peers'
// reads of the slot. Short, but a peer that died there never signals: HVD_TIMEOUT bounds it,
// and abort() ends it at once. ipcReserve waits the same way. `what`: what it waits for.
Status DeviceExecutor::waitForOwnStream(transport::Comm& comm, const char* what) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(config_.timeout_seconds));
  transport::Mesh& mesh = comm.mesh();
  if (stream().drain(deadline, std::chrono::microseconds(kIpcStepSpinMicroseconds),
                     [&mesh] { return mesh.aborted(); })) {
    return Status::ok();
  }
  if (mesh.aborted()) return common::aborted("aborted");
  return common::timedOut(std::string("CUDA IPC: ") + what + " did not finish within "
                          "HVD_TIMEOUT=" + std::to_string(config_.timeout_seconds) +
                          " s (the GPU is stuck, a peer died, or the stream failed)");
}

// Note [IPC output after the drain]: a pooled output block may come with a device wait for its
// last users, recorded on the caller's stream behind queued training kernels; taken before a
// host-ordered op's first step, that wait would sit inside the step's host wait
// (waitForOwnStream). So the ops take their output in their first read, after it.
Status DeviceExecutor::ipcOutput(size_t bytes, OpResult* result, uint8_t** out) {
  if (*out != nullptr || result->buffer != nullptr) return Status::ok();
  HVD_RETURN_IF_ERROR(deviceOutput(bytes, result));
  *out = static_cast<uint8_t*>(result->buffer->data);
  return Status::ok();
}

// dst[0 .. bytes) = the reduction of every member's slot bytes [src_offset, +bytes), with the
// response's op and prescale, then `postscale` (Average: a sum, and the caller's postscale
// divided by the size, as the CPU path does).
Status DeviceExecutor::ipcReduce(const OpContext& op, int slot, size_t src_offset, void* dst,
                                 size_t bytes, double postscale) {
  if (bytes == 0) return Status::ok();
  const coord::Response& r = op.response;
  const void* srcs[cuda::kMaxReduceSources];
  for (int m = 0; m < ipc().members(); ++m) srcs[m] = ipc().slot(m, slot) + src_offset;
  cuda::ReduceJob job;
  job.dtype = r.dtype;
  job.op = r.reduce_op == common::ReduceOp::kAverage ? common::ReduceOp::kSum : r.reduce_op;
  job.srcs = srcs;
  job.nsrcs = ipc().members();
  job.dst = dst;
  job.count = bytes / common::dataTypeSize(r.dtype);
  job.prescale = r.prescale;
  job.postscale = postscale;
  return cuda::launchReduce(job, stream().stream());
}

// The window [lo, lo + n) of the response's tensors packed in order (a joined rank's: zeros).
Status DeviceExecutor::packWindow(const OpContext& op, uint8_t* dst, size_t lo, size_t n) {
  const coord::Response& r = op.response;
  const size_t elem = common::dataTypeSize(r.dtype);
  size_t offset = 0;
  for (size_t i = 0; i < r.keys.size(); ++i) {
    const size_t bytes = static_cast<size_t>(r.counts[i]) * elem;
    const auto [start, length] = overlap(offset, bytes, lo, n);
    if (length > 0 && op.entries[i] != nullptr) {
      HVD_RETURN_IF_ERROR(stream().copy(dst + (start - lo),
                                        static_cast<const uint8_t*>(op.entries[i]->input) +
                                            (start - offset),
                                        length));
    } else if (length > 0) {
      HVD_RETURN_IF_ERROR(stream().zero(dst + (start - lo), length));
    }
    offset += bytes;
  }
  return Status::ok();
}

// A lone tensor is reduced straight into its output; a fused batch (or a joined rank) into the
// device fusion buffer, then copied out.
Status DeviceExecutor::ipcAllreduce(OpContext& op) {
  const coord::Response& r = op.response;
  const size_t bytes = static_cast<size_t>(totalCount(r)) * common::dataTypeSize(r.dtype);
  const bool lone = r.keys.size() == 1 && op.entries[0] != nullptr;
  uint8_t* out = nullptr;
  if (lone) {
    out = static_cast<uint8_t*>(op.entries[0]->output);
  } else {
    void* buffer = nullptr;
    HVD_RETURN_IF_ERROR(stream().deviceBuffer(bytes, &buffer));
    out = static_cast<uint8_t*>(buffer);
  }
  // Spans as NCCL's: a fused batch's packing is MEMCPY_IN_FUSION_BUFFER (once per step).
  if (lone) op.activities.start("CUDA_IPC_ALLREDUCE");
  HVD_RETURN_IF_ERROR(ipcSteps(
      op, bytes,
      [&](uint8_t* mine, size_t lo, size_t n) {
        if (lone) return packWindow(op, mine, lo, n);
        op.activities.start("MEMCPY_IN_FUSION_BUFFER");
        Status packed = packWindow(op, mine, lo, n);
        op.activities.end();
        op.activities.start("CUDA_IPC_ALLREDUCE");  // the barrier, the waits, the reduction
        return packed;
      },
      [&](int slot, size_t lo, size_t n) {
        Status reduced = ipcReduce(op, slot, 0, out + lo, n, postFactor(r, op.comm.size()));
        if (!lone) op.activities.end();
        return reduced;
      }));
  if (lone) op.activities.end();
  if (!lone) {
    op.activities.start("MEMCPY_OUT_FUSION_BUFFER");
    HVD_RETURN_IF_ERROR(unpackOutputs(op, out));
    op.activities.end();
  }
  metrics_.countOp(static_cast<int>(OpType::kAllreduce), bytes, r.keys.size());
  return Status::ok();
}

Status DeviceExecutor::ipcReducescatter(OpContext& op) {
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
  HVD_RETURN_IF_ERROR(ipcSteps(
      op, layout.input_bytes,
      [&](uint8_t* slot, size_t lo, size_t n) {
        return in != nullptr ? stream().copy(slot, in + lo, n) : stream().zero(slot, n);
      },
      [&](int slot, size_t lo, size_t n) {
        HVD_RETURN_IF_ERROR(ipcOutput(mine_bytes, op.result, &out));
        const auto [start, length] = overlap(mine_at, mine_bytes, lo, n);
        return ipcReduce(op, slot, start - lo, out + (start - mine_at), length,
                         postFactor(r, op.comm.size()));
      }));
  HVD_RETURN_IF_ERROR(ipcOutput(mine_bytes, op.result, &out));
  op.result->shape = layout.shape;
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kReducescatter), layout.input_bytes, 1);
  return Status::ok();
}

Status DeviceExecutor::ipcAllgather(OpContext& op) {
  const GatherLayout layout = allgatherLayout(op.response);
  uint8_t* out = nullptr;  // Note [IPC output after the drain]
  const std::vector<size_t> at = offsets(layout.bytes);
  const size_t span = *std::max_element(layout.bytes.begin(), layout.bytes.end());
  const int me = op.comm.rank();
  const auto* in = op.entries[0] != nullptr ? static_cast<const uint8_t*>(op.entries[0]->input)
                                            : nullptr;
  op.activities.start("CUDA_IPC_ALLGATHER");
  HVD_RETURN_IF_ERROR(ipcSteps(
      op, span,
      [&](uint8_t* slot, size_t lo, size_t n) {
        const size_t length = overlap(0, layout.bytes[me], lo, n).second;
        return length > 0 ? stream().copy(slot, in + lo, length) : Status::ok();
      },
      [&](int slot, size_t lo, size_t n) {
        HVD_RETURN_IF_ERROR(ipcOutput(layout.total, op.result, &out));
        for (int m = 0; m < op.comm.size(); ++m) {
          const size_t length = overlap(0, layout.bytes[m], lo, n).second;
          if (length > 0) {
            HVD_RETURN_IF_ERROR(stream().copy(out + at[m] + lo, ipc().slot(m, slot), length));
          }
        }
        return Status::ok();
      }));
  HVD_RETURN_IF_ERROR(ipcOutput(layout.total, op.result, &out));
  op.result->shape = layout.shape;
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kAllgather), layout.total, 1);
  return Status::ok();
}

Status DeviceExecutor::ipcBroadcast(OpContext& op) {
  const coord::Response& r = op.response;
  TensorEntry* entry = op.entries[0];
  const size_t bytes = static_cast<size_t>(r.counts.empty() ? 0 : r.counts[0]) *
                       common::dataTypeSize(r.dtype);
  int root = -1;
  HVD_RETURN_IF_ERROR(rootSetRank(r, op.comm, &root));
  const bool is_root = op.comm.rank() == root;
  void* data = nullptr;
  if (entry != nullptr) {
    data = entry->output;
    if (is_root) HVD_RETURN_IF_ERROR(stream().copy(data, entry->input, bytes));
  } else {
    HVD_RETURN_IF_ERROR(stream().deviceBuffer(bytes, &data));  // a joined rank's scratch
  }
  auto* out = static_cast<uint8_t*>(data);
  op.activities.start("CUDA_IPC_BCAST");
  HVD_RETURN_IF_ERROR(ipcSteps(
      op, bytes,
      [&](uint8_t* slot, size_t lo, size_t n) {
        return is_root ? stream().copy(slot, out + lo, n) : Status::ok();
      },
      [&](int slot, size_t lo, size_t n) {
        return is_root ? Status::ok() : stream().copy(out + lo, ipc().slot(root, slot), n);
      }));
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kBroadcast), bytes, 1);
  return Status::ok();
}

// Member m's input holds its block for each member t at send offset t; this rank copies, from
// every member's window, the part of the block meant for it.
Status DeviceExecutor::ipcAlltoall(OpContext& op) {
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
  HVD_RETURN_IF_ERROR(ipcSteps(
      op, span,
      [&](uint8_t* slot, size_t lo, size_t n) {
        const size_t length = overlap(0, input_bytes[me], lo, n).second;
        return length > 0 ? stream().copy(slot, in + lo, length) : Status::ok();
      },
      [&](int slot, size_t lo, size_t n) {
        HVD_RETURN_IF_ERROR(ipcOutput(mine.total, op.result, &out));
        for (int m = 0; m < n_members; ++m) {
          const auto [start, length] = overlap(block_at[m], mine.recv[m], lo, n);
          if (length == 0) continue;
          HVD_RETURN_IF_ERROR(stream().copy(out + recv_at[m] + (start - block_at[m]),
                                            ipc().slot(m, slot) + (start - lo), length));
        }
        return Status::ok();
      }));
  HVD_RETURN_IF_ERROR(ipcOutput(mine.total, op.result, &out));
  op.result->shape = mine.shape;
  op.result->received_splits = mine.received_splits;
  op.activities.end();
  metrics_.countOp(static_cast<int>(OpType::kAlltoall), mine.total, 1);
  return Status::ok();
}

}  // namespace hvd::runtime
