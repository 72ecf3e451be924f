// DeviceExecutor's allreduce on a mixed set (Note [Device path choice], E): several GPUs, some
// shared by several members. The hierarchical shape the core has for hosts, one level down:
//   1. the members of each GPU reduce over CUDA IPC (every one the whole tensor, prescale
//      applied, a sum for Average) — Note [IPC step protocol] over the GPU's Comm;
//   2. each GPU's leader (its first member) allreduces that partial result with the other
//      leaders through NCCL, in place, then applies the postscale (divided by the whole set's
//      size for Average) with the device reduction;
//   3. each leader hands the result to its GPU's members: one more IPC step in which only the
//      leader writes its slot and the others copy it out.
// Every member of a GPU runs the same steps, so the IPC step count (slot parity) stays equal
// within each GPU; leaders of different GPUs only meet in NCCL. Queued on the stream only.
#include <cstdint>

#include "runtime/device_executor.h"
#include "runtime/op_layout.h"
#include "transport/cuda/device_kernels.h"

namespace hvd::runtime {

using common::Status;
using coord::OpType;
namespace cuda = transport::cuda;

Status DeviceExecutor::mixedAllreduce(OpContext& op) {
  const coord::Response& r = op.response;
  const size_t elem = common::dataTypeSize(r.dtype);
  const size_t count = static_cast<size_t>(totalCount(r));
  const size_t bytes = count * elem;
  const bool lone = r.keys.size() == 1 && op.entries[0] != nullptr;
  const bool leader = current_.set->leader;
  uint8_t* out = nullptr;
  if (lone) {
    out = static_cast<uint8_t*>(op.entries[0]->output);
  } else {
    void* buffer = nullptr;
    HVD_RETURN_IF_ERROR(stream().deviceBuffer(bytes, &buffer));
    out = static_cast<uint8_t*>(buffer);
  }
  op.activities.start("CUDA_IPC_ALLREDUCE");  // 1
  HVD_RETURN_IF_ERROR(ipcSteps(
      op, bytes,
      [&](uint8_t* mine, size_t lo, size_t n) { return packWindow(op, mine, lo, n); },
      [&](int slot, size_t lo, size_t n) {
        return ipcReduce(op, slot, 0, out + lo, n, /*postscale=*/1.0);
      }));
  op.activities.end();
  if (leader && bytes > 0) {  // 2
    const common::ReduceOp across = r.reduce_op == common::ReduceOp::kAverage
                                        ? common::ReduceOp::kSum : r.reduce_op;
    op.activities.start("NCCL_ALLREDUCE");
    HVD_RETURN_IF_ERROR(nccl().allreduce(out, out, count, r.dtype, across, 1.0));
    const double post = postFactor(r, op.comm.size());
    if (post != 1.0) {
      const void* srcs[1] = {out};
      cuda::ReduceJob job;
      job.dtype = r.dtype;
      job.op = common::ReduceOp::kSum;
      job.srcs = srcs;
      job.nsrcs = 1;
      job.dst = out;
      job.count = count;
      job.postscale = post;
      HVD_RETURN_IF_ERROR(cuda::launchReduce(job, stream().stream()));
    }
    op.activities.end();
  }
  op.activities.start("CUDA_IPC_BCAST");  // 3
  HVD_RETURN_IF_ERROR(ipcSteps(
      op, bytes,
      [&](uint8_t* mine, size_t lo, size_t n) {
        return leader ? stream().copy(mine, out + lo, n) : Status::ok();
      },
      [&](int slot, size_t lo, size_t n) {
        return leader ? Status::ok() : stream().copy(out + lo, ipc().slot(0, slot), n);
      }));
  op.activities.end();
  if (!lone) {
    op.activities.start("MEMCPY_OUT_FUSION_BUFFER");
    HVD_RETURN_IF_ERROR(unpackOutputs(op, out));
    op.activities.end();
  }
  metrics_.countOp(static_cast<int>(OpType::kAllreduce), bytes, r.keys.size());
  return Status::ok();
}

}  // namespace hvd::runtime
