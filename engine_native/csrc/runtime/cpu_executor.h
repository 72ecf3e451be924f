// CpuExecutor: the OpExecutor for host memory — the persistent fusion buffer, scale factors
// applied on the host, the CPU algorithms over shm/tcp (algo/). A response whose tensors live
// on a device never reaches it (the Executor routes those to the DeviceExecutor), so it never
// copies a device pointer. Background thread only.
#pragma once

#include <cstdint>
#include <vector>

#include "algo/algorithms.h"
#include "common/config.h"
#include "runtime/metrics.h"
#include "runtime/op_executor.h"

namespace hvd::runtime {

// The reduction step of an allreduce on a packed host buffer of `count` elements of the
// response's dtype: prescale, the CPU algorithm (activity <TRANSPORT>_ALLREDUCE), postscale
// (/ set size for Average). Shared with the staged device path, so both round alike.
common::Status allreduceHostBuffer(OpContext& op, void* buffer, size_t count,
                                   size_t segment_bytes);
// The set rank of the response's (global) broadcast root.
common::Status rootSetRank(const coord::Response& r, const transport::Comm& comm, int* root);

class CpuExecutor : public OpExecutor {
 public:
  CpuExecutor(Metrics& metrics, const common::Config& config)
      : metrics_(metrics), config_(config) {}

  common::Status allreduce(OpContext& op) override;
  common::Status allgather(OpContext& op) override;
  common::Status broadcast(OpContext& op) override;
  common::Status alltoall(OpContext& op) override;
  common::Status reducescatter(OpContext& op) override;

 private:
  // Note [Fusion without a buffer]: false when the batch must be packed instead.
  bool allreduceTensors(OpContext& op, size_t total, common::Status* status);
  // Note [Fused allgather]: several host tensors gathered as one allgatherv.
  common::Status allgatherFused(OpContext& op);
  uint8_t* fusionBuffer(size_t bytes);
  // Note [One round] C (one_round_ops.cc): an op whose every input came with its agreement.
  common::Status oneRound(OpContext& op);

  Metrics& metrics_;
  const common::Config& config_;
  std::vector<uint8_t> fusion_buffer_;   // persistent; grows to the largest fused batch
  std::vector<algo::TensorSpan> spans_;  // a batch's tensors, when the algorithm takes them
};

}  // namespace hvd::runtime
