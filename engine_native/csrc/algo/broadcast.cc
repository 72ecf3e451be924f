// broadcast(): picks the broadcast algorithm for one op, as allgather() does (algo/allgather.cc):
//   1. shm: several members, all on this host, served by the host collective segment: the root
//      writes once, every other rank reads once (algo/broadcast_shm.cc).
//   2. tree: binomial tree or pipelined chain over any pairs (algo/broadcast_tree.cc).
// Every input to the pick is the same on every rank of the Comm, so all ranks pick alike.
#include "algo/algorithms.h"

namespace hvd::algo {

common::Status broadcast(transport::Comm& comm, void* data, size_t bytes, int root,
                         const AllreduceChoice& choice) {
  if (root < 0 || root >= comm.size()) return broadcastTree(comm, data, bytes, root);  // error
  const bool shm = hostSegmentServes(comm, choice);
  if (comm.size() > 1) logCollectivePick("broadcast", shm, comm);
  if (shm) return broadcastShm(comm, data, bytes, root);
  return broadcastTree(comm, data, bytes, root);
}

}  // namespace hvd::algo
