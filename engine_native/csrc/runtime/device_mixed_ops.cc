// The allreduce of a mixed set: the hierarchical shape the core has for hosts, one level down:
//   1. the members of each GPU reduce over CUDA IPC (every one the whole tensor, prescale
//      applied, a sum for Average) — Note [IPC step protocol] over the GPU's Comm;
//   2. each GPU's leader (its first member) allreduces that partial result with the other
//      leaders through NCCL, in place, then applies the postscale (divided by the whole set's
//      size for Average) with the device reduction;
//   3. each leader hands the result to its GPU's members: one more IPC step in which only the
//      leader writes its slot and the others copy it out.
// Every member of a GPU runs the same steps, so the IPC step count (slot parity) stays equal
// within each GPU; leaders of different GPUs only meet in NCCL. Queued on the stream only.
#include "runtime/device_mixed_ops.h"

#include <cstdint>
#include <string>

#include "runtime/op_layout.h"
#include "transport/cuda/device_kernels.h"
#include "transport/nccl/loader.h"

namespace hvd::runtime {

namespace nccl = transport::nccl;
using common::Status;
using coord::OpType;
namespace cuda = transport::cuda;

namespace {

// What the leaders reduce across GPUs: the members' partial results are sums for Average.
common::ReduceOp acrossGpus(common::ReduceOp op) {
  return op == common::ReduceOp::kAverage ? common::ReduceOp::kSum : op;
}

}  // namespace

DeviceMixedOps::DeviceMixedOps(Metrics& metrics, const common::Config& config,
                               std::unique_ptr<transport::Comm> gpu_comm,
                               std::unique_ptr<cuda::IpcPeers> peers,
                               std::unique_ptr<nccl::NcclCommunicator> leaders)
    : metrics_(metrics),
      gpu_comm_(std::move(gpu_comm)),
      steps_(config, std::move(peers)),
      leaders_(std::move(leaders)) {}

// Note [Device path choice], E: only an allreduce NCCL can reduce across the GPUs stays.
bool DeviceMixedOps::stagesThroughHost(const OpContext& op) const {
  const coord::Response& r = op.response;
  return r.type != OpType::kAllreduce ||
         !nccl::ncclCanReduce(*nccl::ncclApi(), r.dtype, acrossGpus(r.reduce_op), 1.0);
}

Status DeviceMixedOps::staged(const OpContext& op) const {
  return common::internalError(std::string("a mixed CUDA set ran ") +
                               coord::opTypeName(op.response.type) +
                               " off the staged path");
}

Status DeviceMixedOps::asyncError() {
  return leaders_ != nullptr ? leaders_->asyncError() : Status::ok();
}

void DeviceMixedOps::abort() {
  if (leaders_ != nullptr) leaders_->abort();
}

Status DeviceMixedOps::allreduce(OpContext& op, DeviceStream& stream) {
  const coord::Response& r = op.response;
  const size_t count = static_cast<size_t>(totalCount(r));
  const size_t bytes = count * common::dataTypeSize(r.dtype);
  const bool leader = leaders_ != nullptr;
  ResultTarget out;  // Note [Result target]
  HVD_RETURN_IF_ERROR(resultTarget(op, stream, bytes, &out));
  op.activities.start("CUDA_IPC_ALLREDUCE");  // 1
  HVD_RETURN_IF_ERROR(steps_.run(
      *gpu_comm_, stream, bytes,
      [&](uint8_t* mine, size_t lo, size_t n) { return packWindow(op, stream, mine, lo, n); },
      [&](int slot, size_t lo, size_t n) {
        return steps_.reduce(r, stream, slot, 0, out.data + lo, n, /*postscale=*/1.0);
      }));
  op.activities.end();
  if (leader && bytes > 0) {  // 2
    op.activities.start("NCCL_ALLREDUCE");
    HVD_RETURN_IF_ERROR(
        leaders_->allreduce(out.data, out.data, count, r.dtype, acrossGpus(r.reduce_op), 1.0));
    const double post = postFactor(r, op.comm.size());
    if (post != 1.0) {
      const void* srcs[1] = {out.data};
      cuda::ReduceJob job;
      job.dtype = r.dtype;
      job.op = common::ReduceOp::kSum;
      job.srcs = srcs;
      job.nsrcs = 1;
      job.dst = out.data;
      job.count = count;
      job.postscale = post;
      HVD_RETURN_IF_ERROR(cuda::launchReduce(job, stream.stream()));
    }
    op.activities.end();
  }
  op.activities.start("CUDA_IPC_BCAST");  // 3
  HVD_RETURN_IF_ERROR(steps_.run(
      *gpu_comm_, stream, bytes,
      [&](uint8_t* mine, size_t lo, size_t n) {
        return leader ? stream.copy(mine, out.data + lo, n) : Status::ok();
      },
      [&](int slot, size_t lo, size_t n) {
        return leader ? Status::ok() : stream.copy(out.data + lo, steps_.peers().slot(0, slot), n);
      }));
  op.activities.end();
  if (!out.lone) {
    op.activities.start("MEMCPY_OUT_FUSION_BUFFER");
    HVD_RETURN_IF_ERROR(unpackOutputs(op, stream, out.data));
    op.activities.end();
  }
  metrics_.countOp(static_cast<int>(OpType::kAllreduce), bytes, r.keys.size());
  return Status::ok();
}

}  // namespace hvd::runtime
