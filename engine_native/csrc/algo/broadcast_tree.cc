// Broadcast: binomial tree for small messages, pipelined chain for large ones.
//
// Ranks are renumbered relative to the root: v = (r - root) mod n, so the root is v = 0.
//
// Binomial tree (S < kChainThresholdBytes). Rank v > 0 receives the whole message once from
// v - lowbit(v) (its parent), then sends it to v + m for every power of two m < lowbit(v) with
// v + m < n (the root: every power of two below n). After round j the first 2^j relative ranks
// hold the data, so the depth is ceil(log2 n) rounds; latency-optimal, but a rank with c
// children sends c·S bytes (the root log2(n)·S). A rank posts all its child sends in one
// exchange so they progress together.
//
// Chain (S >= kChainThresholdBytes). Ranks form the path 0 -> 1 -> ... -> n-1 and the message
// moves in m segments of kChainSegmentBytes. In exchange i a middle rank receives segment i
// from v-1 and, concurrently, sends segment i-1 (received in exchange i-1) to v+1. Each rank
// receives S and sends at most S, so bandwidth per rank is ~S, and the whole takes m + n - 2
// segment times instead of the tree's log2(n) full-message times.
#include <algorithm>

#include "algo/algorithms.h"

namespace hvd::algo {
namespace {

constexpr size_t kChainThresholdBytes = 1 << 20;
constexpr size_t kChainSegmentBytes = 256 << 10;

int toSetRank(int relative, int root, int n) { return (relative + root) % n; }

common::Status broadcastBinomial(transport::Comm& comm, uint8_t* data, size_t bytes, int root) {
  const int n = comm.size();
  const int v = (comm.rank() - root + n) % n;
  // Find the parent: the lowest set bit of v (the root's loop runs past n).
  int mask = 1;
  while (mask < n) {
    if ((v & mask) != 0) {
      HVD_RETURN_IF_ERROR(comm.recv(toSetRank(v - mask, root, n), data, bytes));
      break;
    }
    mask <<= 1;
  }
  // Children: v + m for m = mask/2, mask/4, ..., 1, largest subtree first.
  std::vector<transport::Transfer> sends;
  for (int m = mask >> 1; m > 0; m >>= 1) {
    if (v + m < n) sends.push_back({toSetRank(v + m, root, n), true, data, bytes});
  }
  if (sends.empty()) return common::Status::ok();
  return comm.exchange(sends.data(), sends.size());
}

common::Status broadcastChain(transport::Comm& comm, uint8_t* data, size_t bytes, int root) {
  const int n = comm.size();
  const int v = (comm.rank() - root + n) % n;
  const bool receives = v > 0;
  const bool sends = v < n - 1;
  const size_t segments = (bytes + kChainSegmentBytes - 1) / kChainSegmentBytes;
  auto segment = [&](size_t k, size_t* offset) {
    *offset = k * kChainSegmentBytes;
    return std::min(kChainSegmentBytes, bytes - *offset);
  };
  // The root sends segment i in exchange i; every other rank forwards segment i-1 in exchange i
  // (a lag of one), so it needs one exchange more than there are segments.
  const size_t lag = receives ? 1 : 0;
  for (size_t i = 0; i < segments + lag; ++i) {
    transport::Transfer transfers[2];
    size_t posted = 0;
    size_t offset = 0;
    if (receives && i < segments) {
      const size_t len = segment(i, &offset);
      transfers[posted++] = {toSetRank(v - 1, root, n), false, data + offset, len};
    }
    if (sends && i >= lag) {
      const size_t len = segment(i - lag, &offset);
      transfers[posted++] = {toSetRank(v + 1, root, n), true, data + offset, len};
    }
    if (posted > 0) HVD_RETURN_IF_ERROR(comm.exchange(transfers, posted));
  }
  return common::Status::ok();
}

}  // namespace

common::Status broadcastTree(transport::Comm& comm, void* data, size_t bytes, int root) {
  const int n = comm.size();
  if (root < 0 || root >= n) {
    return common::invalidArgument("broadcast: root rank " + std::to_string(root) +
                                   " is outside the process set of " + std::to_string(n) +
                                   " ranks");
  }
  if (n == 1 || bytes == 0) return common::Status::ok();
  auto* const buffer = static_cast<uint8_t*>(data);
  if (bytes < kChainThresholdBytes) return broadcastBinomial(comm, buffer, bytes, root);
  return broadcastChain(comm, buffer, bytes, root);
}

}  // namespace hvd::algo
