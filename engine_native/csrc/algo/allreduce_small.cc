// Small-message allreduce: one round of direct exchange.
//
// Derivation. Every rank sends its whole buffer (S bytes) to each of the n-1 others and
// receives theirs, all in one Comm::exchange; then each rank folds the n buffers in set-rank
// order, x_0 op x_1 op ... op x_{n-1}, so every rank computes the same bits. One latency term
// instead of the ring's 2(n-1) (or recursive doubling's log2 n), for (n-1)·S bytes each way
// instead of 2(n-1)/n·S: a good trade while (n-1)·S is a few socket buffers or ring slots,
// which the dispatcher bounds (algo/allreduce.cc).
//
// Prediction (2-core machine, np=2): one TCP message each way, ~10-12 us one-way on loopback
// (perf-anchors), so ≈ 15-25 us per 4-byte op on TCP against ≈ 2 round trips (~45 us) for
// the ring's two steps; on shm pairs a few microseconds when peers spin, ~5-7 us per futex
// wake-up when they sleep.
//
// Pipelining: none; the transport overlaps the 2(n-1) transfers of the one exchange.
#include <cstring>
#include <vector>

#include "algo/algorithms.h"
#include "algo/ring_util.h"

namespace hvd::algo {

common::Status allreduceSmall(transport::Comm& comm, const AllreduceOptions& opts) {
  HVD_RETURN_IF_ERROR(common::checkReducible(opts.dtype, opts.op));
  const int n = comm.size();
  const int me = comm.rank();
  if (opts.count == 0 || n == 1) return common::Status::ok();
  if (opts.data == nullptr) return common::invalidArgument("allreduce: null data buffer");
  const size_t bytes = opts.count * common::dataTypeSize(opts.dtype);
  // Slot r receives rank r's buffer.
  uint8_t* const slots = threadScratch(static_cast<size_t>(n) * bytes);
  if (slots == nullptr) {
    return common::internalError("allreduce: cannot allocate a " +
                                 std::to_string(static_cast<size_t>(n) * bytes) +
                                 "-byte receive buffer");
  }
  uint8_t* const data = static_cast<uint8_t*>(opts.data);
  std::vector<transport::Transfer> transfers;
  transfers.reserve(2 * static_cast<size_t>(n - 1));
  for (int k = 1; k < n; ++k) {  // rotated, so rank 0 is not everyone's first peer
    const int peer = (me + k) % n;
    transfers.push_back({peer, true, data, bytes, 0});
    transfers.push_back({peer, false, slots + static_cast<size_t>(peer) * bytes, bytes, 0});
  }
  HVD_RETURN_IF_ERROR(comm.exchange(transfers.data(), transfers.size()));
  if (me != 0) {
    std::memcpy(slots + static_cast<size_t>(me) * bytes, data, bytes);
    std::memcpy(data, slots, bytes);
  }
  for (int r = 1; r < n; ++r) {
    common::reduceInto(data, slots + static_cast<size_t>(r) * bytes, opts.count, opts.dtype,
                       opts.op);
  }
  return common::Status::ok();
}

}  // namespace hvd::algo
