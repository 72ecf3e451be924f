// Ring allgather.
//
// Derivation. Rank r starts with its own block r in place (copied into out's slot for r; `in`
// may already be that slot). In step t = 0..n-2 rank r sends block (r-t) mod n to next = r+1
// and receives block (r-t-1) mod n from prev = r-1 into its slot. Step 0 sends the own block;
// step t forwards exactly what step t-1 received, so after n-1 steps each rank has received
// every block but its own once. Blocks may have any size, zero included (a zero-byte transfer
// is never posted, by either end: Note [Ring wire protocol] in algo/ring_util.h). Every rank
// sends and receives S - S_r bytes (≈ (n-1)/n · S when blocks are even), which is optimal.
//
// Pipelining. There is no arithmetic to overlap: a step is one exchange with the send and the
// receive progressing concurrently, and the transport pipelines inside a transfer. The same
// phase is the second half of allreduceRing (ringAllgatherInPlace).
#include <cstring>

#include "algo/algorithms.h"
#include "algo/ring_util.h"

namespace hvd::algo {

common::Status ringAllgatherInPlace(transport::Comm& comm, void* data, const BlockOffsets& bytes) {
  const int n = comm.size();
  const int r = comm.rank();
  uint8_t* const base = static_cast<uint8_t*>(data);
  for (int step = 0; step + 1 < n; ++step) {
    const int send_block = ringBlock(r, step, n);
    const int recv_block = ringBlock(r, step + 1, n);
    transport::Transfer transfers[2];
    size_t posted = 0;
    if (blockSize(bytes, send_block) > 0) {
      transfers[posted++] = {ringNext(comm), true, base + bytes[send_block],
                             blockSize(bytes, send_block)};
    }
    if (blockSize(bytes, recv_block) > 0) {
      transfers[posted++] = {ringPrev(comm), false, base + bytes[recv_block],
                             blockSize(bytes, recv_block)};
    }
    if (posted > 0) HVD_RETURN_IF_ERROR(comm.exchange(transfers, posted));
  }
  return common::Status::ok();
}

common::Status allgatherRing(transport::Comm& comm, const void* in, void* out,
                             const std::vector<size_t>& bytes_per_rank) {
  const int n = comm.size();
  if (bytes_per_rank.size() != static_cast<size_t>(n)) {
    return common::invalidArgument("allgather: " + std::to_string(bytes_per_rank.size()) +
                                   " block sizes given for a process set of " +
                                   std::to_string(n) + " ranks");
  }
  const BlockOffsets bytes = prefixBlocks(bytes_per_rank);
  uint8_t* const own = static_cast<uint8_t*>(out) + bytes[comm.rank()];
  const size_t own_bytes = bytes_per_rank[comm.rank()];
  if (own_bytes > 0 && own != in) std::memmove(own, in, own_bytes);
  return ringAllgatherInPlace(comm, out, bytes);
}

}  // namespace hvd::algo
