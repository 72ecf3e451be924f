// allreduce(): picks the allreduce algorithm for one op.
//
// Derivation of the pick, in order (the first that applies wins):
//   1. shm: every member is on this host and the host collective segment serves the Comm
//      (all of the host's ranks are in it; not HVD_TRANSPORT=tcp). No socket, every byte
//      copied a minimal number of times; small buffers take its one-round form. Best at
//      every size within a host (algo/allreduce_shm.cc).
//   2. small: S <= choice.small_bytes and (n-1)·S <= kSmallTotalBytes: one round of direct
//      exchange, one latency term instead of 2(n-1) (algo/allreduce_small.cc).
//   3. hierarchical: asked for (HVD_HIERARCHICAL_ALLREDUCE) and the Comm spans several hosts,
//      one of them with several members (algo/allreduce_hierarchical.cc).
//   4. ring: reduce-scatter + allgather, bandwidth-optimal over any pairs
//      (algo/allreduce_ring.cc).
// Adasum is not element-wise and has an algorithm of its own (algo/allreduce_adasum.cc).
// Every input to the pick (choice, sizes, membership, host ids, whether a host's ranks agreed
// on a segment) is the same on every rank of the Comm, so all ranks pick alike; a host's
// segment decision binds all of its ranks (Note [Collective setup]).
#include "algo/algorithms.h"
#include "common/logging.h"
#include "transport/shm/collective_sync.h"

namespace hvd::algo {
namespace {

constexpr size_t kSmallTotalBytes = 256 << 10;

enum class Algorithm { kShm = 0, kSmall, kHierarchical, kRing, kCount };

const char* algorithmName(Algorithm a) {
  switch (a) {
    case Algorithm::kShm: return "shm (host collective segment)";
    case Algorithm::kSmall: return "small (one-round direct exchange)";
    case Algorithm::kHierarchical: return "hierarchical (host, cross-host ring, host)";
    case Algorithm::kRing: return "ring (reduce-scatter + allgather)";
    case Algorithm::kCount: break;
  }
  return "?";
}

Algorithm pick(const transport::Comm& comm, const AllreduceOptions& opts,
               const AllreduceChoice& choice) {
  const int n = comm.size();
  const bool one_host = static_cast<int>(comm.localMembers().size()) == n;
  if (one_host && choice.shared_memory &&
      transport::shm::CollectiveSync::segmentFor(comm) != nullptr) {
    return Algorithm::kShm;
  }
  const size_t bytes = opts.count * common::dataTypeSize(opts.dtype);
  if (bytes <= choice.small_bytes && bytes * static_cast<size_t>(n - 1) <= kSmallTotalBytes) {
    return Algorithm::kSmall;
  }
  if (choice.hierarchical && !one_host && hierarchicalHelps(comm)) return Algorithm::kHierarchical;
  return Algorithm::kRing;
}

// Decisions are logged once at info, per algorithm and process.
void logPick(Algorithm a, const transport::Comm& comm) {
  static bool logged[static_cast<int>(Algorithm::kCount)] = {};
  bool& done = logged[static_cast<int>(a)];
  if (!done) {
    HVD_LOG(kInfo, "algo") << "allreduce via " << algorithmName(a) << " (process set of "
                           << comm.size() << ", " << comm.localMembers().size()
                           << " on this host)";
    done = true;
  }
}

}  // namespace

AllreduceChoice AllreduceChoice::fromConfig(const common::Config& config, bool hierarchical) {
  AllreduceChoice choice;
  choice.hierarchical = hierarchical;
  choice.shared_memory = config.transport != "tcp";
  return choice;
}

bool allreduceTakesTensors(const transport::Comm& comm, const AllreduceOptions& opts,
                           const AllreduceChoice& choice) {
  if (opts.count == 0 || comm.size() == 1 || opts.op == common::ReduceOp::kAdasum) return false;
  return pick(comm, opts, choice) == Algorithm::kShm && shmTakesTensors(opts);
}

common::Status allreduce(transport::Comm& comm, const AllreduceOptions& opts,
                         const AllreduceChoice& choice) {
  if (opts.op == common::ReduceOp::kAdasum) {
    if (opts.tensors != nullptr) return common::internalError("Adasum: pack the batch first");
    return allreduceAdasum(comm, opts, choice);
  }
  HVD_RETURN_IF_ERROR(common::checkReducible(opts.dtype, opts.op));
  if (opts.count == 0 || comm.size() == 1) return common::Status::ok();
  const Algorithm a = pick(comm, opts, choice);
  logPick(a, comm);
  if (opts.tensors != nullptr && a != Algorithm::kShm) {
    return common::internalError("allreduce: only the shm path takes a batch's tensors");
  }
  switch (a) {
    case Algorithm::kShm: return allreduceShm(comm, opts);
    case Algorithm::kSmall: return allreduceSmall(comm, opts);
    case Algorithm::kHierarchical: return allreduceHierarchical(comm, opts);
    case Algorithm::kRing:
    case Algorithm::kCount: break;
  }
  return allreduceRing(comm, opts);
}

}  // namespace hvd::algo
