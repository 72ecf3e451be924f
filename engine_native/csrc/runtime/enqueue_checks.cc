// The checks of an enqueued op on the calling rank, before anything is submitted (Runtime,
// runtime.h): Horovod's ValueError/TypeError for a bad dtype, shape, set, root or splits; one
// GPU per rank and process set; and, for a CUDA tensor, the event on its producer's stream.
// Framework threads, under Runtime's lock.
#include <string>

#include "algo/algorithms.h"
#include "runtime/runtime.h"
#include "transport/nccl/loader.h"

namespace hvd::runtime {

using common::Status;
using coord::OpType;

namespace {

std::string describe(const coord::Request& r, std::string_view name) {
  return std::string(coord::opTypeName(r.type)) + "('" + std::string(name) + "')";
}

}  // namespace

Status Runtime::validate(coord::Request* r, std::string_view name) const {
  if (!common::isValidDataType(static_cast<int32_t>(r->dtype))) {
    return common::typeError(describe(*r, name) + ": unsupported dtype code " +
                             std::to_string(static_cast<int>(r->dtype)));
  }
  for (int64_t d : r->shape) {
    if (d < 0) return common::invalidArgument(describe(*r, name) + ": negative dimension in shape");
  }
  // The global set (0) is every rank and never changes: no table lookup on the common path.
  const auto set = r->process_set == 0
                       ? ProcessSetTable::Membership{true, true,
                                                     r->root_rank >= 0 && r->root_rank < size_,
                                                     size_}
                       : sets_.membership(r->process_set, rank_, r->root_rank);
  if (!set.registered) {
    return common::invalidArgument(describe(*r, name) + ": process set " +
                                   std::to_string(r->process_set) +
                                   " is not registered; create it with add_process_set()");
  }
  if (!set.has_rank) {
    return common::invalidArgument(describe(*r, name) + ": rank " + std::to_string(rank_) +
                                   " is not a member of process set " +
                                   std::to_string(r->process_set));
  }
  const int64_t n = set.size;
  switch (r->type) {
    case OpType::kAllreduce:
    case OpType::kReducescatter: {
      // Adasum (allreduce only) has Horovod's dtype and power-of-two rules.
      const bool adasum =
          r->type == OpType::kAllreduce && r->reduce_op == common::ReduceOp::kAdasum;
      Status s = adasum ? algo::checkAdasum(r->dtype, static_cast<int>(n))
                        : common::checkReducible(r->dtype, r->reduce_op);
      if (!s.isOk()) return Status(s.code(), describe(*r, name) + ": " + s.message());
      if (r->type == OpType::kReducescatter && r->shape.empty()) {
        return common::invalidArgument(describe(*r, name) + ": a scalar cannot be reduce-scattered; "
                                       "give it at least one dimension");
      }
      break;
    }
    case OpType::kAllgather:
      if (r->shape.empty()) {
        return common::invalidArgument(describe(*r, name) + ": a scalar cannot be gathered; reshape "
                                       "it to [1]");
      }
      break;
    case OpType::kBroadcast:
      // root_rank is a global rank, as in Horovod, and must belong to the process set.
      if (!set.has_root) {
        return common::invalidArgument(
            describe(*r, name) + ": root_rank " + std::to_string(r->root_rank) +
            (r->process_set == 0 ? " is outside [0, " + std::to_string(n) + ")"
                                 : " is not a member of process set " +
                                       std::to_string(r->process_set)));
      }
      break;
    case OpType::kAlltoall: {
      if (r->shape.empty()) {
        return common::invalidArgument(describe(*r, name) + ": a scalar cannot be sent with alltoall");
      }
      const int64_t dim0 = r->shape[0];
      if (r->splits.empty()) {
        if (dim0 % n != 0) {
          return common::invalidArgument(
              describe(*r, name) + ": dimension 0 (" + std::to_string(dim0) +
              ") is not divisible by the number of ranks (" + std::to_string(n) +
              "); pass splits");
        }
        r->splits.assign(n, dim0 / n);
      }
      if (static_cast<int64_t>(r->splits.size()) != n) {
        return common::invalidArgument(describe(*r, name) + ": splits has " +
                                       std::to_string(r->splits.size()) +
                                       " entries, expected one per rank (" + std::to_string(n) +
                                       ")");
      }
      int64_t sum = 0;
      for (int64_t s : r->splits) {
        if (s < 0) return common::invalidArgument(describe(*r, name) + ": splits must be >= 0");
        sum += s;
      }
      if (sum != dim0) {
        return common::invalidArgument(describe(*r, name) + ": splits sum to " + std::to_string(sum) +
                                       " but dimension 0 is " + std::to_string(dim0));
      }
      break;
    }
    case OpType::kBarrier:
    case OpType::kJoin:
      break;
  }
  return Status::ok();
}

// Note [join's device without CUDA]
// join(device=k) says where this rank's zeros live while the others reduce CUDA tensors. In a
// process with no CUDA device (no runtime, or a runtime that sees none) no rank-local CUDA
// tensor can exist, so the join is a CPU join, as Horovod built without GPU support makes it
// (DoJoin forces CPU_DEVICE_ID). Refusing it instead left this rank out of the join and its
// peers waiting for it forever. With devices, a missing ordinal stays this rank's ValueError.

// One GPU per rank and process set (as Horovod: one GPU per process): the set's communicator
// lives on it. A tensor elsewhere is this rank's mistake, caught here, before any rank runs it.
Status Runtime::checkDevice(coord::Request* r, std::string_view name) {
  if (r->device < 0 || r->type == OpType::kBarrier) return Status::ok();
  if (r->type == OpType::kJoin) {  // where this rank's zeros will live: a device it has
    const transport::nccl::CudaApi* cuda = transport::nccl::cudaApi();
    int count = 0;
    if (cuda == nullptr || cuda->getDeviceCount(&count) != 0 || count <= 0) {
      r->device = -1;  // Note [join's device without CUDA]
      return Status::ok();
    }
    if (r->device >= count) {
      return common::invalidArgument("join(device=" + std::to_string(r->device) + "): this "
                                     "process has " + std::to_string(count) + " CUDA device(s)");
    }
    return Status::ok();
  }
  const auto [it, first] = set_devices_.emplace(r->process_set, r->device);
  if (first || it->second == r->device) return Status::ok();
  return common::invalidArgument(
      describe(*r, name) + ": this rank's CUDA tensors of process set " +
      std::to_string(r->process_set) + " are on cuda:" + std::to_string(it->second) +
      ", this one is on cuda:" + std::to_string(r->device) + "; keep them on one GPU per rank");
}

// Note [Graph capture]
// A CUDA op enqueued while its producer's stream captures a CUDA graph (torch.cuda.graph,
// CUDAGraph.capture_begin) cannot be right: its ready event would be recorded into the graph
// instead of on the stream, and the collective, which the core's thread runs on the core's own
// streams, would be no part of any replay. So it is refused on the calling rank before anything
// is recorded or submitted. The legacy default stream answers cudaErrorStreamCaptureImplicit
// while another stream captures in global mode: that is refused too. Any other answer (an
// invalid stream) is left to recordReady, whose error names it.
Status Runtime::checkNotCapturing(const TensorEntry& entry, std::string_view name) const {
  const coord::Request& r = entry.request;
  if (r.device < 0 || r.type == OpType::kBarrier || r.type == OpType::kJoin) return Status::ok();
  return refuseGraphCapture(entry.stream, describe(r, name));
}

// A CUDA tensor's op waits (on the device) for its producer's stream as it is now.
Status Runtime::recordReady(TensorEntry* entry) const {
  const coord::Request& r = entry->request;
  if (r.device < 0 || r.type == OpType::kBarrier || r.type == OpType::kJoin) return Status::ok();
  return entry->ready.record(r.device,
                             reinterpret_cast<transport::nccl::CudaStream>(entry->stream));
}

}  // namespace hvd::runtime
