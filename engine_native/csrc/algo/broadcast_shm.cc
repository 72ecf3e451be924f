// Shared-memory broadcast among the L ranks of one host, through the host collective segment
// (transport/shm/collective_segment.h): the root writes the message once, every other rank
// reads it once, with no tree or chain of hops (issue #20).
//
// Derivation. The message (S bytes) is cut into pieces of P bytes; piece k goes through slot
// k % depth of the root's segment area (P up to the whole slot, chunk_bytes = L x 256 KiB).
//   root    waits until every other rank released piece k - depth (its slot is free), copies
//           piece k of its input in, publishes it, then copies the piece to its own output
//           when that is another buffer (in cache by then; the readers copy out meanwhile)
//   others  wait until the root posted piece k, copy it out and release it
// Per rank S bytes copied (the root in, every other rank out): the least a copy through shared
// memory allows, against the chain's S in and S out per middle rank (algo/broadcast_tree.cc)
// and its L-1 hops of latency. The root may run `depth` pieces ahead of the slowest reader, so
// its copy-in overlaps the readers' copy-out; readers read the same slot at the same time.
// P is the slot for large messages but at least 8 pieces (down to 16 KiB) so 1 MiB still
// pipelines; a message of a few KiB is one piece: one wait per reader, none for the root.
//
// Counters (Note [Host pipeline] in algo/allreduce_shm.cc). Every rank publishes all three
// milestones for each piece: the root after copying in (it reads no other rank's slot, so it
// has nothing to release later), a reader after copying out (its slot is not used). So every
// rank's counters end the op at base + pieces, equal everywhere (rule 1), and the next op's
// post waits on kReleased exactly as rule 2 needs: readers released what they read.
//
// Prediction (2-core AMD VM, float32): np=2, 16 MiB: 16 MiB copied by each rank, overlapped,
// 32 pieces of 512 KiB, slots hot in cache: ≈ 2 ms (chain 6.2 ms, MPICH 2.45 ms). np=4, 1 MiB:
// 8 pieces of 128 KiB, three readers on two cores: ≈ 0.3 ms (tree 1.2 ms, MPICH 0.37 ms).
#include <algorithm>
#include <cstring>

#include "algo/algorithms.h"
#include "algo/peer_block.h"
#include "algo/single_copy.h"
#include "transport/shm/cross_memory.h"
#include "transport/shm/collective_sync.h"

namespace hvd::algo {
namespace {

using transport::shm::CollectiveSync;
using transport::shm::Stage;

constexpr size_t kMinPieces = 8;
constexpr size_t kMinPieceBytes = 16 << 10;

common::Status broadcastPieces(CollectiveSync& sync, const uint8_t* root_in, uint8_t* data,
                               size_t bytes, int root) {
  const size_t slot_bytes = static_cast<size_t>(sync.segment().chunkBytes());
  const size_t spread = (bytes + kMinPieces - 1) / kMinPieces;
  const size_t piece = std::min(slot_bytes, (std::max(spread, kMinPieceBytes) + 63) / 64 * 64);
  const uint64_t pieces = (bytes + piece - 1) / piece;
  const uint64_t depth = sync.segment().depth();
  const uint64_t base = sync.released();
  const bool is_root = sync.index() == root;
  for (uint64_t k = 0; k < pieces; ++k) {
    const uint64_t g = base + k;
    const size_t offset = k * piece;
    const size_t len = std::min(piece, bytes - offset);
    if (is_root) {
      if (g >= depth) HVD_RETURN_IF_ERROR(sync.waitAll(Stage::kReleased, g + 1 - depth));
      std::memcpy(sync.segment().slot(root, g), root_in + offset, len);
      sync.publish({Stage::kPosted, Stage::kReduced, Stage::kReleased}, g + 1);
      // Its own output after publishing: the readers copy the piece out meanwhile.
      if (root_in != data) std::memcpy(data + offset, root_in + offset, len);
    } else {
      HVD_RETURN_IF_ERROR(sync.waitFor(root, Stage::kPosted, g + 1));
      std::memcpy(data + offset, sync.segment().slot(root, g), len);
      sync.publish({Stage::kPosted, Stage::kReduced, Stage::kReleased}, g + 1);
    }
  }
  return common::Status::ok();
}

// Note [Single-copy ops] in algo/single_copy.cc: the readers copy the root's input straight
// into their output; the root copies only its own output, and returns once all have read.
common::Status broadcastSingleCopy(CollectiveSync& sync, const uint8_t* root_in, uint8_t* data,
                                   size_t bytes, int root) {
  const bool is_root = sync.index() == root;
  SingleCopyOp op;
  op.in = is_root ? root_in : nullptr;
  op.bytes = is_root ? bytes : 0;
  op.source = root;
  op.read_by_others = is_root;
  if (is_root && root_in != data) op.local = [&] { std::memcpy(data, root_in, bytes); };
  op.read = [&](int j, const PeerInput& peer) {
    HVD_RETURN_IF_ERROR(checkPeerBlock("broadcast", j, peer.bytes, 0, peer.bytes, bytes));
    return transport::shm::readPeer(peer.pid, peer.address, data, bytes);
  };
  return runSingleCopy(sync, op);
}

}  // namespace

common::Status broadcastShm(transport::Comm& comm, const void* root_in, void* data,
                            size_t bytes, int root) {
  transport::shm::CollectiveSegment* segment = CollectiveSync::segmentFor(comm);
  if (segment == nullptr || static_cast<int>(comm.localMembers().size()) != comm.size()) {
    return common::internalError("shm broadcast: no host collective segment serves this "
                                 "process set of " + std::to_string(comm.size()) + " ranks");
  }
  if (bytes == 0 || comm.size() == 1) return common::Status::ok();
  CollectiveSync sync(comm, segment);
  if (singleCopyServes(sync, bytes)) {
    return broadcastSingleCopy(sync, static_cast<const uint8_t*>(root_in),
                               static_cast<uint8_t*>(data), bytes,
                               sync.localIndexOf(comm.globalRank(root)));
  }
  return broadcastPieces(sync, static_cast<const uint8_t*>(root_in),
                         static_cast<uint8_t*>(data), bytes,
                         sync.localIndexOf(comm.globalRank(root)));
}

}  // namespace hvd::algo
