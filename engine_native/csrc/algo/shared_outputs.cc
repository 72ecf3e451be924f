// Host collectives that write into the ranks' outputs (algo/shared_outputs.h).
//
// Note [Shared outputs]
// Where the host's ranks may write into each other's memory (Note [Shared-output probe] in
// transport/shm/shared_blocks.cc) and the largest transfer is at least kMinBytes, every
// rank's output is a shared block (the executor asks the pool for one: writesIntoOutputs) and
// each rank writes what it sends straight into the receivers' outputs: one copy per byte,
// where the slots take two (into the sender's slot, out of it). Per rank, alltoall copies S
// instead of 2S - S/L bytes (np=2: 1.5S -> S); allgather L·B instead of (L+1)·B. The op is
// one chunk g = released() in the counters' numbering (as Note [Single-copy ops]):
//   1. every rank writes (offset in its output, bytes) of the block it receives from each local
//      index into its slot for chunk g (after rule 2's wait), and its output's SharedBlockRef and
//      bytes into its PeerRegion, then publishes kPosted = g + 1;
//   2. it waits until every rank posted and copies what it sends to each rank, itself
//      included, into that rank's output through its mapping of the receiver's block (Note
//      [Peer block cache]), piece by piece across the ranks, after checking that the receiver
//      expects exactly those bytes at that offset;
//   3. it publishes kReduced = kReleased = g + 1 and waits for every rank's kReleased: then
//      every block of its output has been written, and no peer reads its slot or region any
//      more.
// A rank whose pool could not get a shared block (memfds refused, or the cap on live blocks in
// transport/shm/shared_blocks.cc reached: outputs kept alive hold one descriptor each) posts
// out_fd -1; every rank sees it once all posted, releases chunk g and runs the op through the
// slots from chunk g + 1 instead, so a user holding many outputs gets a slower op, not an
// error (metrics()["shared_output_fallbacks"]).
// A write that cannot be made (a mapping refused) ends this rank's writes as a single-copy
// read does: `failed` = g + 1, release, wait for every rank's release (the peers still writing
// into this rank's output must find it there), return the error; a rank waiting in step 3 then
// ends its op with an error naming that rank. An output a peer may still write into (the wait
// for the posts or for the releases ended in an error) is retired: the pool never reuses it.
// Prediction (2-core VM, float32, the pool's blocks reused, mappings cached): alltoall np=2
// 16 MiB per rank 1.13 ms -> ~0.75 ms (1.5S -> S per rank, copy-bound); np=4 16 MiB 3.5 ->
// ~2.2 ms (1.75S -> S); 1 MiB np=2 46 -> ~32 us; 4 B unchanged (below the threshold: the
// slots, one round trip where this takes two). allgather np=2 1 MiB parts: 3B -> 2B per rank.
// Measured (benchmarks/RESULTS.md, issue #20 part 9, A/B against the slots on a slow VM
// state): 1.24-1.30x faster at np=2 1 MiB, 1.22-1.49x at np=4 1-64 MiB, even at np=2 16-64
// MiB, where both paths read and write memory once and the slots' extra copy stays in cache.
#include "algo/shared_outputs.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "transport/shm/shared_blocks.h"

namespace hvd::algo {

using transport::shm::CollectiveSync;
using transport::shm::PeerRegion;
using transport::shm::SharedBlockRef;
using transport::shm::Stage;

namespace {

// Below this largest transfer the slots' single round trip per op beats the two here.
constexpr size_t kMinBytes = 64 << 10;
constexpr size_t kPieceBytes = 256 << 10;  // copyInPieces: well inside L2
std::atomic<uint64_t> g_ops{0};
std::atomic<uint64_t> g_fallbacks{0};
std::atomic<uint64_t> g_started{0};  // numbers each op for the peer block cache

// Step 1: the landing table into this rank's slot for chunk `base`, the output into its region.
void publish(CollectiveSync& sync, const SharedOutputOp& op, uint64_t base,
             SharedBlockRef* ref) {
  auto* table = reinterpret_cast<uint64_t*>(sync.segment().slot(sync.index(), base));
  for (size_t j = 0; j < op.landing.size(); ++j) {
    table[2 * j] = op.landing[j];
    table[2 * j + 1] = op.expected[j];
  }
  if (!transport::shm::findSharedBlock(op.out, op.out_bytes, ref)) ref->fd = -1;
  PeerRegion* own = sync.segment().region(sync.index());
  own->out_serial.store(ref->serial, std::memory_order_relaxed);
  own->out_capacity.store(ref->capacity, std::memory_order_relaxed);
  own->out_offset.store(ref->offset, std::memory_order_relaxed);
  own->out_inode.store(ref->inode, std::memory_order_relaxed);
  own->out_device.store(ref->device, std::memory_order_relaxed);
  own->out_bytes.store(op.out_bytes, std::memory_order_relaxed);
  own->out_fd.store(ref->fd, std::memory_order_relaxed);
  sync.publish({Stage::kPosted}, base + 1);  // release: table and region before the counter
}

// Step 2's destination in local rank j's output for `len` bytes from this rank, mapped here.
common::Status destination(const CollectiveSync& sync, int j, uint64_t base, size_t len,
                           uint64_t op_id, uint8_t** dst) {
  const PeerRegion* region = sync.segment().region(j);
  SharedBlockRef ref;
  ref.fd = region->out_fd.load(std::memory_order_relaxed);  // the posted counter ordered it
  ref.serial = region->out_serial.load(std::memory_order_relaxed);
  ref.capacity = region->out_capacity.load(std::memory_order_relaxed);
  ref.offset = region->out_offset.load(std::memory_order_relaxed);
  ref.inode = region->out_inode.load(std::memory_order_relaxed);
  ref.device = region->out_device.load(std::memory_order_relaxed);
  const uint64_t bytes = region->out_bytes.load(std::memory_order_relaxed);
  const auto* table = reinterpret_cast<const uint64_t*>(sync.segment().slot(j, base));
  const uint64_t at = table[2 * static_cast<size_t>(sync.index())];
  const uint64_t expected = table[2 * static_cast<size_t>(sync.index()) + 1];
  // The numbers come from another process: nothing may overflow on them.
  if (expected != len || ref.offset > ref.capacity || bytes > ref.capacity - ref.offset ||
      at > bytes || len > bytes - at) {
    return common::internalError("rank " + std::to_string(sync.globalRankOf(j)) + " expects " +
                                 std::to_string(expected) + " bytes from this rank at offset " +
                                 std::to_string(at) + " of its " + std::to_string(bytes) +
                                 "-byte output, which has to take " + std::to_string(len) +
                                 ": the ranks disagree on the sizes");
  }
  uint8_t* mapped = nullptr;
  HVD_RETURN_IF_ERROR(
      transport::shm::mapPeerBlock(sync.segment().peerPid(j), ref, op_id, &mapped));
  *dst = mapped + ref.offset + at;
  return common::Status::ok();
}

// Step 2's copies, piece by piece across the destinations: where one source goes to several
// outputs (allgather), each piece is read from memory once and then from the cache.
void copyInPieces(const std::vector<const uint8_t*>& from, const std::vector<uint8_t*>& to,
                  const std::vector<size_t>& len) {
  size_t longest = 0;
  for (size_t b : len) longest = std::max(longest, b);
  for (size_t at = 0; at < longest; at += kPieceBytes) {
    for (size_t j = 0; j < to.size(); ++j) {
      if (at >= len[j] || from[j] == to[j]) continue;
      std::memcpy(to[j] + at, from[j] + at, std::min(kPieceBytes, len[j] - at));
    }
  }
}

// Whether some rank's output is not in a shared block (its pool could not get one), read once
// every rank posted: then no rank writes into outputs and all take the slots (step 2).
bool someOutputPrivate(const CollectiveSync& sync) {
  for (int j = 0; j < sync.size(); ++j) {
    if (sync.segment().region(j)->out_fd.load(std::memory_order_relaxed) < 0) return true;
  }
  return false;
}

// Step 3's check: which peer gave up writing in op g, if any.
common::Status peerFailures(const CollectiveSync& sync, const SharedOutputOp& op, uint64_t g) {
  for (int j = 0; j < sync.size(); ++j) {
    if (j == sync.index()) continue;
    if (sync.segment().region(j)->failed.load(std::memory_order_acquire) == g) {
      return common::internalError(
          std::string(op.name) + ": rank " + std::to_string(sync.globalRankOf(j)) + " of this "
          "host could not write into its peers' outputs and ended the op (its own error says "
          "why); set HVD_SHARED_OUTPUTS=0 to copy through the shared segment instead");
    }
  }
  return common::Status::ok();
}

}  // namespace

bool writesIntoOutputs(const transport::Comm& comm, size_t largest,
                       const AllreduceChoice& choice) {
  if (largest < kMinBytes || !hostSegmentServes(comm, choice)) return false;
  const transport::shm::CollectiveSegment* segment = CollectiveSync::segmentFor(comm);
  if (segment == nullptr || !segment->sharedOutputs()) return false;
  // The single-copy read, where on, comes first (alltoallShm, allgatherShm): no shared output.
  return !(segment->singleCopy() == transport::shm::SingleCopyScope::kEveryOp &&
           largest >= segment->singleCopyMinBytes());
}

uint64_t sharedOutputOps() { return g_ops.load(std::memory_order_relaxed); }
uint64_t sharedOutputFallbacks() { return g_fallbacks.load(std::memory_order_relaxed); }

common::Status runSharedOutputs(CollectiveSync& sync, const SharedOutputOp& op,
                                bool* use_slots) {
  *use_slots = false;
  const int me = sync.index();
  const uint64_t base = sync.released();
  const uint64_t g = base + 1;
  const uint64_t depth = sync.segment().depth();
  if (base >= depth) HVD_RETURN_IF_ERROR(sync.waitAll(Stage::kReleased, base + 1 - depth));
  SharedBlockRef ref;
  publish(sync, op, base, &ref);
  common::Status status = sync.waitAll(Stage::kPosted, g);
  const bool all_posted = status.isOk();
  if (status.isOk() && someOutputPrivate(sync)) {  // every rank sees the same regions
    g_fallbacks.fetch_add(1, std::memory_order_relaxed);
    sync.publish({Stage::kReduced, Stage::kReleased}, g);
    *use_slots = true;
    return common::Status::ok();
  }
  if (status.isOk()) g_ops.fetch_add(1, std::memory_order_relaxed);
  const uint64_t op_id = g_started.fetch_add(1, std::memory_order_relaxed) + 1;
  const auto n = static_cast<size_t>(sync.size());
  std::vector<const uint8_t*> from(n, nullptr);
  std::vector<uint8_t*> to(n, nullptr);
  std::vector<size_t> len(n, 0);
  for (size_t j = 0; j < n && status.isOk(); ++j) {
    std::tie(from[j], len[j]) = op.block_for(static_cast<int>(j));
    if (len[j] == 0) continue;
    if (static_cast<int>(j) == me) {
      to[j] = op.out + op.landing[j];
    } else {
      status = destination(sync, static_cast<int>(j), base, len[j], op_id, &to[j]);
    }
  }
  if (status.isOk()) copyInPieces(from, to, len);
  if (!status.isOk()) {  // no more writes from here: the others must not wait for them
    sync.segment().region(me)->failed.store(g, std::memory_order_relaxed);
    sync.publish({Stage::kReduced, Stage::kReleased}, g);  // release: `failed` first
    // After a failed mapping the peers may still be writing into this output: it stays,
    // descriptor and all, until they are done, so their ops end naming this rank, not a block
    // freed under them. After a failed wait for the posts nobody writes (a peer writes once
    // all posted), and a second wait would only time out again.
    const bool drained = all_posted && sync.waitAll(Stage::kReleased, g).isOk();
    if (!drained && ref.fd >= 0) transport::shm::retireSharedBlock(op.out);
    return common::Status(status.code(), "rank " + std::to_string(sync.globalRankOf(me)) +
                                             ", " + op.name + " into the peers' outputs: " +
                                             status.message());
  }
  sync.publish({Stage::kReduced, Stage::kReleased}, g);
  status = sync.waitAll(Stage::kReleased, g);  // 3: every block of this output is written
  if (!status.isOk() && ref.fd >= 0) transport::shm::retireSharedBlock(op.out);
  if (status.isOk()) status = peerFailures(sync, op, g);
  return status;
}

}  // namespace hvd::algo
