// Pairwise-exchange alltoall.
//
// Derivation. Rank r's own block (send_bytes[r] -> recv_bytes[r]) is copied locally. Then in
// step k = 1..n-1 rank r sends its block for (r+k) mod n and receives the block from
// (r-k) mod n, both in one exchange. In step k rank s sends to s+k, so the sender that rank r
// hears from is exactly r-k: every step is a perfect matching of senders to receivers and no
// rank is the target of two senders at once. n-1 steps; each rank sends and receives exactly
// its off-diagonal bytes once (optimal), with one latency term per step. Blocks may be empty;
// empty transfers are not posted by either end (the sizes are agreed: send_bytes[p] on rank r
// equals recv_bytes[r] on rank p, as negotiated before the call).
//
// Pipelining. None needed: no arithmetic, and each step's send and receive progress
// concurrently inside the exchange.
#include <cstring>

#include "algo/algorithms.h"
#include "algo/ring_util.h"

namespace hvd::algo {

common::Status checkAlltoallSplits(const transport::Comm& comm,
                                   const std::vector<size_t>& send_bytes,
                                   const std::vector<size_t>& recv_bytes) {
  const int n = comm.size();
  const int r = comm.rank();
  if (send_bytes.size() != static_cast<size_t>(n) || recv_bytes.size() != static_cast<size_t>(n)) {
    return common::invalidArgument("alltoall: " + std::to_string(send_bytes.size()) + " send and " +
                                   std::to_string(recv_bytes.size()) +
                                   " receive splits given for a process set of " +
                                   std::to_string(n) + " ranks");
  }
  if (send_bytes[r] != recv_bytes[r]) {
    return common::invalidArgument("alltoall: rank " + std::to_string(r) + " sends " +
                                   std::to_string(send_bytes[r]) + " bytes to itself but expects " +
                                   std::to_string(recv_bytes[r]));
  }
  return common::Status::ok();
}

common::Status alltoallPairwise(transport::Comm& comm, const void* in,
                                const std::vector<size_t>& send_bytes, void* out,
                                const std::vector<size_t>& recv_bytes) {
  HVD_RETURN_IF_ERROR(checkAlltoallSplits(comm, send_bytes, recv_bytes));
  const int n = comm.size();
  const int r = comm.rank();
  const BlockOffsets send_at = prefixBlocks(send_bytes);
  const BlockOffsets recv_at = prefixBlocks(recv_bytes);
  // Transfer::data is non-const for both directions; sends only read it.
  auto* const src = const_cast<uint8_t*>(static_cast<const uint8_t*>(in));
  auto* const dst = static_cast<uint8_t*>(out);
  if (send_bytes[r] > 0 && dst + recv_at[r] != src + send_at[r]) {
    std::memmove(dst + recv_at[r], src + send_at[r], send_bytes[r]);
  }
  for (int k = 1; k < n; ++k) {
    const int to = (r + k) % n;
    const int from = (r - k + n) % n;
    transport::Transfer transfers[2];
    size_t posted = 0;
    if (send_bytes[to] > 0) transfers[posted++] = {to, true, src + send_at[to], send_bytes[to]};
    if (recv_bytes[from] > 0) {
      transfers[posted++] = {from, false, dst + recv_at[from], recv_bytes[from]};
    }
    if (posted > 0) HVD_RETURN_IF_ERROR(comm.exchange(transfers, posted));
  }
  return common::Status::ok();
}

}  // namespace hvd::algo
