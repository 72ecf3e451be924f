// Adasum allreduce: Horovod's vector-halving, distance-doubling (VHDD) Adasum
// (common/ops/adasum/adasum.h, adasum_mpi.cc), over a Comm of n = 2^k ranks.
//
// Derivation. Adasum combines two gradients a and b as
//   a (+) b = (1 - a.b / (2|a|^2)) a + (1 - a.b / (2|b|^2)) b,
// which is a + b when a is orthogonal to b and (a + b)/2 when they are parallel (then
// b = c a and both coefficients come to a mean). A coefficient whose |x|^2 is below
// sqrt(DBL_MIN) is 1, Horovod's guard for a zero vector. n gradients combine in a binary tree
// by set rank: level j (distance d = 2^j) joins the blocks of d ranks [b·2d, b·2d + d) and
// [b·2d + d, (b+1)·2d): ((g0 (+) g1) (+) (g2 (+) g3)) (+) ... The operation is not
// associative, so this pairing is the definition, as in Horovod.
//  Phase 1, vector halving (levels d = 1, 2, ..., n/2). Partners r and r^d hold the same range
//   [lo, hi) of the buffer (all of it at d = 1), r's with its block's partial result. The range
//   splits at mid = lo + (hi-lo)/2; the rank with bit d clear keeps [lo, mid), its partner
//   [mid, hi), each sending the other half and receiving the partner's values of the half it
//   keeps. Now, for each tensor t of the batch, the ranks of the two blocks together hold t's
//   elements exactly once, lower-block values ("a") next to upper-block values ("b"): each rank
//   sums a.b, |a|^2, |b|^2 over its piece in double, and the 3T partial sums are added up over
//   the 2d ranks by recursive doubling (each step adds the partner's vector: x + y == y + x,
//   so all 2d ranks end with the same bits, hence the same coefficients). Then its piece
//   becomes alpha_t a + beta_t b. After log2(n) levels rank r holds about count/n elements of
//   the result.
//  Phase 2, distance doubling (levels d = n/2, ..., 1): partners swap their ranges; the union
//   is the range of the level before. Every element was computed by exactly one rank, so
//   every rank ends with the same bits.
// Bytes per rank: phase 1 sends S/2 + S/4 + ... = (n-1)/n·S, phase 2 the same, so
// 2(n-1)/n·S as the ring, in 2·log2(n) exchanges, plus log2(n)(log2(n)+1)/2 exchanges of 24T
// bytes for the sums.
//  Fused batches: Adasum is not element-wise. As Horovod's FusedPairwiseReduceWithComm, the
//   sums and coefficients are per tensor (the batch's counts travel with the buffer), so each
//   tensor gets the Adasum of its own gradients whatever it was fused with.
//  Hierarchical form (Horovod's AdasumGpuAllreduceOp, there for NCCL builds' GPU tensors):
//   every host has L ranks and the H hosts are a power of two. 1. reduce-scatter (sum) within
//   the host: local rank l holds block l of the host's sum (algo/host_layout.h); 2. phase 1
//   among local rank l of every host, on block l, the sums of each level added over the cross
//   group and then over the host's L ranks (folded in local-rank order, the same on every
//   host); 3. phase 2 among them; 4. allgather within the host. The caller divides by L
//   (Horovod: postscale /= local_size), so hosts combine their averages: Adasum scales
//   (ca (+) cb = c (a (+) b)).
// Pipelining: none inside an exchange (Comm::exchange streams any size; Horovod's
// HOROVOD_ADASUM_MPI_CHUNK_SIZE only bounds MPI message sizes).
#include <algorithm>
#include <vector>

#include "algo/adasum_kernels.h"
#include "algo/algorithms.h"
#include "algo/host_layout.h"
#include "algo/ring_util.h"
#include "common/logging.h"

namespace hvd::algo {
namespace {

bool isPowerOfTwo(int n) { return n > 0 && (n & (n - 1)) == 0; }

// The batch in the buffer: tensor t is [offsets[t], offsets[t+1]) (elements).
struct Batch {
  uint8_t* data = nullptr;
  BlockOffsets offsets;
  common::DataType dtype = common::DataType::kFloat32;
  size_t esize = 0;
  size_t tensors() const { return offsets.size() - 1; }
  uint8_t* at(size_t element) const { return data + element * esize; }
};

// A range [lo, hi) both partners of a level held, split at mid (phase 2 undoes it).
struct Split {
  size_t lo = 0, mid = 0, hi = 0;
};

// The level's partner holds what we do not; zero-byte transfers are never posted (both ends
// derive the sizes from the same split: Note [Ring wire protocol] in ring_util.h).
common::Status swapWith(transport::Comm& comm, int peer, const void* send, size_t send_bytes,
                        void* recv, size_t recv_bytes) {
  transport::Transfer transfers[2];
  size_t posted = 0;
  if (send_bytes > 0) transfers[posted++] = {peer, true, const_cast<void*>(send), send_bytes, 0};
  if (recv_bytes > 0) transfers[posted++] = {peer, false, recv, recv_bytes, 0};
  return posted == 0 ? common::Status::ok() : comm.exchange(transfers, posted);
}

// Sum of `sums` over the 2^levels set ranks sharing comm.rank() >> levels, by recursive
// doubling; every member ends with the same bits.
common::Status groupSum(transport::Comm& comm, std::vector<double>& sums, int levels) {
  std::vector<double> theirs(sums.size());
  const size_t bytes = sums.size() * sizeof(double);
  for (int i = 0; i < levels; ++i) {
    HVD_RETURN_IF_ERROR(swapWith(comm, comm.rank() ^ (1 << i), sums.data(), bytes,
                                 theirs.data(), bytes));
    for (size_t k = 0; k < sums.size(); ++k) sums[k] += theirs[k];
  }
  return common::Status::ok();
}

// The receive buffer of phase 1: this thread's, kept across calls (not threadScratch, which
// the host phases and allreduceSmall use in between).
uint8_t* receiveBuffer(size_t bytes) {
  thread_local std::vector<uint8_t> buffer;
  if (buffer.size() < bytes) buffer.resize(bytes);
  return buffer.data();
}

// One level of phase 1 on [lo, hi), which this rank now keeps; `other` holds the partner's
// values of it. `local`: the hierarchical form's host Comm, whose ranks' sums add in too.
common::Status combine(transport::Comm& comm, transport::Comm* local, const Batch& batch,
                       size_t lo, size_t hi, const uint8_t* other, bool lower, int level) {
  const size_t tensors = batch.tensors();
  // Per tensor: a.b, |a|^2 (lower block), |b|^2 (upper block).
  std::vector<double> sums(3 * tensors, 0.0);
  for (size_t t = 0; t < tensors; ++t) {
    const size_t begin = std::max(lo, batch.offsets[t]), end = std::min(hi, batch.offsets[t + 1]);
    if (begin >= end) continue;
    const DotAndNorms s =
        dotAndNorms(batch.at(begin), other + (begin - lo) * batch.esize, end - begin, batch.dtype);
    sums[3 * t] = s.dot;
    sums[3 * t + 1] = lower ? s.own : s.other;
    sums[3 * t + 2] = lower ? s.other : s.own;
  }
  HVD_RETURN_IF_ERROR(groupSum(comm, sums, level + 1));
  if (local != nullptr && local->size() > 1) {
    AllreduceOptions host;  // the host's L partial sums, folded in local-rank order
    host.data = sums.data();
    host.count = sums.size();
    host.dtype = common::DataType::kFloat64;
    host.op = common::ReduceOp::kSum;
    HVD_RETURN_IF_ERROR(allreduceSmall(*local, host));
  }
  for (size_t t = 0; t < tensors; ++t) {
    const size_t begin = std::max(lo, batch.offsets[t]), end = std::min(hi, batch.offsets[t + 1]);
    if (begin >= end) continue;
    const double a = adasumCoefficient(sums[3 * t], sums[3 * t + 1]);
    const double b = adasumCoefficient(sums[3 * t], sums[3 * t + 2]);
    scaledAdd(batch.at(begin), lower ? a : b, other + (begin - lo) * batch.esize, lower ? b : a,
              end - begin, batch.dtype);
  }
  return common::Status::ok();
}

// Phases 1 and 2 over `comm` (a power of two) on the buffer range [begin, end).
common::Status vectorHalvingDistanceDoubling(transport::Comm& comm, transport::Comm* local,
                                             const Batch& batch, size_t begin, size_t end) {
  const int n = comm.size(), r = comm.rank();
  std::vector<Split> splits;
  size_t lo = begin, hi = end;
  uint8_t* const other = receiveBuffer((end - begin + 1) / 2 * batch.esize);
  for (int level = 0, d = 1; d < n; ++level, d <<= 1) {
    const Split s{lo, lo + (hi - lo) / 2, hi};
    const bool lower = (r & d) == 0;
    const size_t keep_lo = lower ? s.lo : s.mid, keep_hi = lower ? s.mid : s.hi;
    const size_t give_lo = lower ? s.mid : s.lo, give_hi = lower ? s.hi : s.mid;
    HVD_RETURN_IF_ERROR(swapWith(comm, r ^ d, batch.at(give_lo), (give_hi - give_lo) * batch.esize,
                                 other, (keep_hi - keep_lo) * batch.esize));
    splits.push_back(s);
    lo = keep_lo;
    hi = keep_hi;
    HVD_RETURN_IF_ERROR(combine(comm, local, batch, lo, hi, other, lower, level));
  }
  for (int d = n >> 1; d >= 1; d >>= 1) {
    const Split s = splits.back();
    splits.pop_back();
    const bool lower = (r & d) == 0;
    const size_t theirs_lo = lower ? s.mid : s.lo, theirs_hi = lower ? s.hi : s.mid;
    HVD_RETURN_IF_ERROR(swapWith(comm, r ^ d, batch.at(lo), (hi - lo) * batch.esize,
                                 batch.at(theirs_lo), (theirs_hi - theirs_lo) * batch.esize));
    lo = s.lo;
    hi = s.hi;
  }
  return common::Status::ok();
}

// The hierarchical form applies: asked for, several hosts of L ranks each, one of them with
// several (then H = n / L is a power of two as n is). The same on every rank of the Comm.
bool useHierarchical(const transport::Comm& comm, const AllreduceChoice& choice,
                     HostLayout* layout) {
  if (!choice.hierarchical) return false;
  *layout = layoutOf(comm);
  return layout->even && layout->hosts.size() > 1 && layout->hosts[0].size() > 1;
}

common::Status hierarchical(transport::Comm& comm, const HostLayout& layout, const Batch& batch,
                            const AllreduceOptions& opts) {
  const std::vector<int>& mine = layout.hosts[layout.my_host];
  transport::Comm local = subComm(comm, mine);
  const int l = layout.my_local;
  HVD_RETURN_IF_ERROR(hostBlocksReduceScatter(local, opts.data, opts.count, opts.dtype,
                                              common::ReduceOp::kSum, opts.segment_bytes));
  std::vector<int> peers;  // local rank l of every host, hosts in layout order
  for (const std::vector<int>& host : layout.hosts) peers.push_back(host[l]);
  transport::Comm cross = subComm(comm, peers);
  const BlockOffsets blocks = evenBlocks(opts.count, static_cast<int>(mine.size()));
  HVD_RETURN_IF_ERROR(
      vectorHalvingDistanceDoubling(cross, &local, batch, blocks[l], blocks[l + 1]));
  return hostBlocksAllgather(local, opts.data, opts.count, opts.dtype);
}

void logForm(bool hierarchical, const transport::Comm& comm) {
  static bool logged[2] = {};
  if (logged[hierarchical]) return;
  logged[hierarchical] = true;
  HVD_LOG(kInfo, "algo") << "Adasum allreduce via "
                         << (hierarchical ? "hierarchical VHDD (host sums, Adasum across hosts)"
                                          : "VHDD (vector halving, distance doubling)")
                         << " (process set of " << comm.size() << ")";
}

}  // namespace

common::Status checkAdasum(common::DataType dtype, int set_size) {
  if (!common::isFloatingPoint(dtype)) {
    return common::typeError(std::string("Adasum: Unsupported data type ") +
                             common::dataTypeName(dtype) + " (Horovod's Adasum reduces float16, "
                             "bfloat16, float32 and float64 tensors); use op=Average or op=Sum");
  }
  if (!isPowerOfTwo(set_size)) {
    return common::invalidArgument(
        "Running Adasum with non-power of 2 ranks is not supported yet: the process set has " +
        std::to_string(set_size) + " ranks; use 1, 2, 4, 8, ... ranks, or op=Average");
  }
  return common::Status::ok();
}

int adasumHostAverage(const transport::Comm& comm, const AllreduceChoice& choice) {
  HostLayout layout;
  return useHierarchical(comm, choice, &layout) ? static_cast<int>(layout.hosts[0].size()) : 1;
}

common::Status allreduceAdasum(transport::Comm& comm, const AllreduceOptions& opts,
                               const AllreduceChoice& choice) {
  HVD_RETURN_IF_ERROR(checkAdasum(opts.dtype, comm.size()));
  if (opts.count == 0 || comm.size() == 1) return common::Status::ok();
  if (opts.data == nullptr) return common::invalidArgument("allreduce: null data buffer");
  Batch batch;
  batch.data = static_cast<uint8_t*>(opts.data);
  batch.dtype = opts.dtype;
  batch.esize = common::dataTypeSize(opts.dtype);
  batch.offsets.push_back(0);
  if (opts.tensor_counts != nullptr) {
    for (size_t t = 0; t < opts.tensor_count; ++t) {
      batch.offsets.push_back(batch.offsets.back() + static_cast<size_t>(opts.tensor_counts[t]));
    }
  } else {
    batch.offsets.push_back(opts.count);
  }
  if (batch.offsets.back() != opts.count) {
    return common::internalError("Adasum: the batch's tensor counts sum to " +
                                 std::to_string(batch.offsets.back()) + ", not " +
                                 std::to_string(opts.count));
  }
  HostLayout layout;
  const bool two_level = useHierarchical(comm, choice, &layout);
  logForm(two_level, comm);
  if (two_level) return hierarchical(comm, layout, batch, opts);
  return vectorHalvingDistanceDoubling(comm, nullptr, batch, 0, opts.count);
}

}  // namespace hvd::algo
