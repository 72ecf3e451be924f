// Collective algorithms: type-erased free functions over a Comm (set ranks) and options.
// Each lives in its own file with a prose derivation at the top (phases, bytes moved,
// pipelining). All are called by the background thread; buffers are host memory owned by the
// caller and stay valid for the call. Every rank of the Comm calls the same function with
// matching arguments (the response list guarantees it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "algo/span_buffer.h"
#include "common/config.h"
#include "common/dtype.h"
#include "common/status.h"
#include "transport/comm.h"
#include "transport/shm/collective_segment.h"

namespace hvd::algo {

struct AllreduceOptions {
  void* data = nullptr;        // in-place: input on entry, reduced result on return
  size_t count = 0;            // elements
  // Instead of `data`, a fused batch's tensors (their counts sum to `count`): inputs read,
  // outputs written, no packing. Only where allreduceTakesTensors() says so (the shm path).
  const std::vector<TensorSpan>* tensors = nullptr;
  common::DataType dtype = common::DataType::kFloat32;
  common::ReduceOp op = common::ReduceOp::kSum;  // Average reduces as Sum; caller scales
  size_t segment_bytes = 1 << 20;  // pipelining unit
  // Adasum only: the element counts of the batch's `tensor_count` tensors in buffer order
  // (they sum to `count`); null means one tensor. Adasum combines each tensor as a vector.
  const int64_t* tensor_counts = nullptr;
  size_t tensor_count = 0;
};
// Ring reduce-scatter + allgather (algo/allreduce_ring.cc).
common::Status allreduceRing(transport::Comm& comm, const AllreduceOptions& opts);

// What allreduce() may choose from. Every rank of a Comm must pass the same choice: the pick
// depends only on it, the sizes and the topology.
struct AllreduceChoice {
  bool hierarchical = false;         // HVD_HIERARCHICAL_ALLREDUCE, or autotune's current value
  bool shared_memory = true;         // false when HVD_TRANSPORT=tcp
  size_t small_bytes = 16 << 10;     // direct exchange at or below this size (and n-1 copies
                                     // of it at or below 256 KiB)
  // Staged device ops: their host buffers are pinned (cudaMallocHost), which a peer's
  // process_vm_readv may not read, so their broadcasts read directly only where the user asked
  // for every op (HVD_SINGLE_COPY=1), not under auto.
  bool pinned_host_buffers = false;
  // From the env table, with `hierarchical` the value in force (Note [Runtime allreduce
  // choice] in runtime/executor.h).
  static AllreduceChoice fromConfig(const common::Config& config, bool hierarchical);
};
// The dispatcher (algo/allreduce.cc): shm within one host, else direct exchange for small
// buffers, else hierarchical when asked for and useful, else the ring. Logs each pick once.
common::Status allreduce(transport::Comm& comm, const AllreduceOptions& opts,
                         const AllreduceChoice& choice);
// True when allreduce() with these options would work on `opts.tensors` directly (the host
// pipeline, for batches above its one-round size); otherwise the caller packs a fusion buffer.
bool allreduceTakesTensors(const transport::Comm& comm, const AllreduceOptions& opts,
                           const AllreduceChoice& choice);
// Through the host collective segment; every member on this host and all of the host's ranks
// in the Comm (algo/allreduce_shm.cc). Takes opts.tensors when shmTakesTensors(opts).
common::Status allreduceShm(transport::Comm& comm, const AllreduceOptions& opts);
bool shmTakesTensors(const AllreduceOptions& opts);
// One round: every rank sends its buffer to every other, and all fold the n copies in set-rank
// order (algo/allreduce_small.cc).
common::Status allreduceSmall(transport::Comm& comm, const AllreduceOptions& opts);
// Within hosts, across hosts, within hosts again (algo/allreduce_hierarchical.cc).
common::Status allreduceHierarchical(transport::Comm& comm, const AllreduceOptions& opts);
// True when the Comm spans several hosts and at least one of them has several members.
bool hierarchicalHelps(const transport::Comm& comm);

// Adasum (algo/allreduce_adasum.cc), which allreduce() dispatches to for op == kAdasum:
// Horovod's vector-halving, distance-doubling Adasum per tensor of opts.data, in place; with
// choice.hierarchical and several hosts of equal size, host sums are combined across hosts.
common::Status allreduceAdasum(transport::Comm& comm, const AllreduceOptions& opts,
                               const AllreduceChoice& choice);
// Horovod's rules for an Adasum request (checked at enqueue): a floating-point dtype (else
// TypeError, "Unsupported data type") and a power-of-two set size (else InvalidArgument).
common::Status checkAdasum(common::DataType dtype, int set_size);
// The ranks whose sum enters allreduceAdasum as one vector: a host's L in the hierarchical form,
// else 1. The caller divides the result by it (Horovod's postscale /= local_size).
int adasumHostAverage(const transport::Comm& comm, const AllreduceChoice& choice);

// Host pipeline phases (algo/allreduce_shm.cc) over the host collective segment: `comm`
// includes every rank of this host. The buffer is cut into L = (ranks on this host) blocks
// as evenBlocks(count, L) does; block i belongs to the host's i-th rank in global-rank order.
// hostReduceScatter: on return block i of rank i is reduced over the host (others unchanged).
// hostAllgather: given block i valid on rank i, every block is valid everywhere on return.
common::Status hostReduceScatter(transport::Comm& comm, void* data, size_t count,
                                 common::DataType dtype, common::ReduceOp op);
common::Status hostAllgather(transport::Comm& comm, void* data, size_t count,
                             common::DataType dtype);

// out = concatenation over set ranks r of each rank's bytes[r]; `in` holds this rank's part
// (it may be that part of `out`). The dispatcher (algo/allgather.cc) takes the host collective
// segment when hostSegmentServes(), else the ring; allgatherShm and allgatherRing are its two
// algorithms (algo/allgather_shm.cc, algo/allgather_ring.cc). `choice`: only shared_memory.
// out_shared: as alltoall's.
common::Status allgather(transport::Comm& comm, const void* in, void* out,
                         const std::vector<size_t>& bytes_per_rank,
                         const AllreduceChoice& choice, bool out_shared = false);
common::Status allgatherShm(transport::Comm& comm, const void* in, void* out,
                            const std::vector<size_t>& bytes_per_rank, bool out_shared);
common::Status allgatherRing(transport::Comm& comm, const void* in, void* out,
                             const std::vector<size_t>& bytes_per_rank);
// Within hosts, leaders' ring, host broadcast (algo/allgather_hierarchical.cc); only where
// hostsContiguous(comm): every host's members are consecutive set ranks in global order.
common::Status allgatherHierarchical(transport::Comm& comm, const void* in, void* out,
                                     const std::vector<size_t>& bytes_per_rank);
bool hostsContiguous(const transport::Comm& comm);

// Root's data replaces everyone's (in-place). The dispatcher (algo/broadcast.cc) picks as
// allgather() does between broadcastShm (algo/broadcast_shm.cc) and broadcastTree
// (algo/broadcast_tree.cc). `root_in`: the root's input, which ends in `data` on every rank
// (the root's own `data` included); it may be `data`, and is not read on other ranks, so no
// rank copies its input to `data` first.
common::Status broadcast(transport::Comm& comm, const void* root_in, void* data, size_t bytes,
                         int root, const AllreduceChoice& choice);
// `needs`: the host's single-copy scope that lets it read the root's input directly (Note
// [Two-thread reads]): kBroadcast for a broadcast the user asked for, kEveryOp for a step of
// another collective or a staged device op's pinned buffer.
common::Status broadcastShm(transport::Comm& comm, const void* root_in, void* data,
                            size_t bytes, int root, transport::shm::SingleCopyScope needs);
common::Status broadcastTree(transport::Comm& comm, void* data, size_t bytes, int root);
// Leaders' tree across hosts, then each host from its leader (algo/broadcast_hierarchical.cc).
common::Status broadcastHierarchical(transport::Comm& comm, const void* root_in, void* data,
                                     size_t bytes, int root,
                                     transport::shm::SingleCopyScope needs);

// True when the Comm has several members, all on this host, and the host collective segment
// serves it (every rank of the host in it; not HVD_TRANSPORT=tcp): the same on every rank.
bool hostSegmentServes(const transport::Comm& comm, const AllreduceChoice& choice);
// Logs "<op> via <path>" at info once per process, op and path (algo/allgather.cc): the
// decision the tests read back.
enum class CopyCollective { kAllgather = 0, kBroadcast = 1, kAlltoall = 2, kReducescatter = 3 };
enum class CopyPath { kShm = 0, kPairs = 1, kHierarchical = 2 };
void logCollectivePick(CopyCollective op, CopyPath path, const transport::Comm& comm);

// send_bytes[r] from `in` (consecutive) go to rank r; recv_bytes[r] from rank r land in `out`
// (consecutive, in rank order). The dispatcher (algo/alltoall.cc) takes the host collective
// segment when hostSegmentServes() (algo/alltoall_shm.cc), else the pairwise exchange
// (algo/alltoall_pairwise.cc). `largest`: the largest off-diagonal block of the whole splits
// matrix in bytes, the same on every rank (the shm path's chunk count). out_shared: every
// rank's `out` is a shared block, as algo/shared_outputs.h writesIntoOutputs() asked (the same
// on every rank); the shm path then writes into the outputs (Note [Shared outputs]).
common::Status alltoall(transport::Comm& comm, const void* in,
                        const std::vector<size_t>& send_bytes, void* out,
                        const std::vector<size_t>& recv_bytes, size_t largest,
                        const AllreduceChoice& choice, bool out_shared = false);
common::Status alltoallShm(transport::Comm& comm, const void* in,
                           const std::vector<size_t>& send_bytes, void* out,
                           const std::vector<size_t>& recv_bytes, size_t largest,
                           bool out_shared);
common::Status alltoallPairwise(transport::Comm& comm, const void* in,
                                const std::vector<size_t>& send_bytes, void* out,
                                const std::vector<size_t>& recv_bytes);
// InvalidArgument unless there is one split per rank and this rank's own block matches.
common::Status checkAlltoallSplits(const transport::Comm& comm,
                                   const std::vector<size_t>& send_bytes,
                                   const std::vector<size_t>& recv_bytes);

// `in` has sum(counts) elements; rank r receives the reduction of elements
// [offset(r), offset(r)+counts[r]) into `out` (counts[r] elements). The dispatcher
// (algo/alltoall.cc) takes the host collective segment when hostSegmentServes()
// (algo/reducescatter_shm.cc), else the ring (algo/reducescatter_ring.cc); both fold in the
// same order (Note [Reduce-scatter fold order]). `in_writable`: `in` is the caller's scratch
// copy, which the ring may reduce in instead of copying it again.
common::Status reducescatter(transport::Comm& comm, const void* in, void* out,
                             const std::vector<size_t>& counts, common::DataType dtype,
                             common::ReduceOp op, const AllreduceChoice& choice,
                             bool in_writable);
common::Status reducescatterShm(transport::Comm& comm, const void* in, void* out,
                                const std::vector<size_t>& counts, common::DataType dtype,
                                common::ReduceOp op);
common::Status reducescatterRing(transport::Comm& comm, const void* in, void* out,
                                 const std::vector<size_t>& counts, common::DataType dtype,
                                 common::ReduceOp op);
// The same, reducing in `data` (this rank's input, overwritten with partial sums) instead of a
// copy of it: for callers that already hold a copy (prescaled, or staged from a device).
common::Status reducescatterRingInPlace(transport::Comm& comm, void* data, void* out,
                                        const std::vector<size_t>& counts,
                                        common::DataType dtype, common::ReduceOp op);

// Returns when every rank of the Comm has entered. (algo/barrier.cc)
common::Status barrier(transport::Comm& comm);

}  // namespace hvd::algo
