// alltoall() and reducescatter(): pick the algorithm for one op, as allgather() does
// (algo/allgather.cc):
//   1. shm: several members, all on this host, served by the host collective segment: each
//      rank writes what it sends once and reads (and reduces) only its own part
//      (algo/alltoall_shm.cc, algo/reducescatter_shm.cc).
//   2. otherwise, across hosts too, the existing algorithms over pairs, shm or tcp: the
//      pairwise exchange (algo/alltoall_pairwise.cc) and the ring (algo/reducescatter_ring.cc).
//      No hierarchical form yet: on several hosts an alltoall's traffic is mostly between
//      hosts anyway, and a host-level reduce-scatter first would change the ring's fold order
//      (Note [Reduce-scatter fold order]).
// Every input to the pick is the same on every rank of the Comm, so all ranks pick alike.
#include "algo/algorithms.h"

namespace hvd::algo {

common::Status alltoall(transport::Comm& comm, const void* in,
                        const std::vector<size_t>& send_bytes, void* out,
                        const std::vector<size_t>& recv_bytes, size_t largest,
                        const AllreduceChoice& choice, bool out_shared) {
  const bool shm = hostSegmentServes(comm, choice) &&
                   send_bytes.size() == static_cast<size_t>(comm.size()) &&
                   recv_bytes.size() == send_bytes.size();
  if (comm.size() > 1) {
    logCollectivePick(CopyCollective::kAlltoall, shm ? CopyPath::kShm : CopyPath::kPairs, comm);
  }
  if (shm) {
    HVD_RETURN_IF_ERROR(checkAlltoallSplits(comm, send_bytes, recv_bytes));
    return alltoallShm(comm, in, send_bytes, out, recv_bytes, largest, out_shared);
  }
  return alltoallPairwise(comm, in, send_bytes, out, recv_bytes);
}

common::Status reducescatter(transport::Comm& comm, const void* in, void* out,
                             const std::vector<size_t>& counts, common::DataType dtype,
                             common::ReduceOp op, const AllreduceChoice& choice,
                             bool in_writable) {
  const bool shm = hostSegmentServes(comm, choice);
  if (comm.size() > 1) {
    logCollectivePick(CopyCollective::kReducescatter, shm ? CopyPath::kShm : CopyPath::kPairs,
                      comm);
  }
  if (shm) return reducescatterShm(comm, in, out, counts, dtype, op);
  if (!in_writable) return reducescatterRing(comm, in, out, counts, dtype, op);
  return reducescatterRingInPlace(comm, const_cast<void*>(in), out, counts, dtype, op);
}

}  // namespace hvd::algo
