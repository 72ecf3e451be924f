// Dissemination barrier.
//
// Derivation. In round j = 0, 1, ... while 2^j < n, rank r sends one byte to (r + 2^j) mod n
// and receives one byte from (r - 2^j) mod n, in one exchange. By induction, after round j
// rank r has (transitively) heard from the 2^(j+1) - 1 ranks r-1, ..., r-(2^(j+1)-1): round j
// adds the ranks that r - 2^j had heard from, plus r - 2^j itself. After ceil(log2 n) rounds
// that covers all n-1 other ranks, so no rank leaves before every rank has entered. Works for
// any n (no power-of-two restriction), moves ceil(log2 n) bytes each way per rank, and has
// ceil(log2 n) latency terms. With n = 2 both transfers go to the same peer, which is fine: a
// send and a receive are independent directions of the pair.
#include <cstdint>

#include "algo/algorithms.h"

namespace hvd::algo {

common::Status barrier(transport::Comm& comm) {
  const int n = comm.size();
  const int r = comm.rank();
  uint8_t token = 1;
  uint8_t received = 0;
  for (int distance = 1; distance < n; distance <<= 1) {
    transport::Transfer transfers[2] = {
        {(r + distance) % n, true, &token, 1},
        {(r - distance + n) % n, false, &received, 1},
    };
    HVD_RETURN_IF_ERROR(comm.exchange(transfers, 2));
  }
  return common::Status::ok();
}

}  // namespace hvd::algo
