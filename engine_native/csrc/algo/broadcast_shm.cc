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
// P is the slot for large messages but at least 8 pieces (down to 16 KiB, or 128 KiB where
// the host's cores are shared) so 1 MiB still pipelines (Note [Piece size] in
// algo/segment_walk.h); a message of a few KiB is one piece:
// one wait per reader, none for the root.
//
// Counters (Note [Host pipeline] in algo/allreduce_shm.cc; SegmentWalk's one-writer walk in
// algo/segment_walk.h). Every rank publishes all three
// milestones for each piece: the root after copying in (it reads no other rank's slot, so it
// has nothing to release later), a reader after copying out (its slot is not used). So every
// rank's counters end the op at base + pieces, equal everywhere (rule 1), and the next op's
// post waits on kReleased exactly as rule 2 needs: readers released what they read.
//
// Prediction (2-core AMD VM, float32): np=2, 16 MiB: 16 MiB copied by each rank, overlapped,
// 32 pieces of 512 KiB, slots hot in cache: ≈ 2 ms (chain 6.2 ms, MPICH 2.45 ms). np=4, 1 MiB:
// 8 pieces of 128 KiB, three readers on two cores: ≈ 0.3 ms (tree 1.2 ms, MPICH 0.37 ms).
#include <sched.h>

#include <algorithm>
#include <cstring>

#include "algo/algorithms.h"
#include "algo/peer_block.h"
#include "algo/segment_walk.h"
#include "algo/single_copy.h"
#include "common/cpu_relax.h"
#include "transport/mesh.h"
#include "transport/shm/collective_sync.h"
#include "transport/shm/cross_memory.h"
#include "transport/shm/helper_read.h"

namespace hvd::algo {
namespace {

using transport::shm::CollectiveSync;

// SegmentWalk with one writer: the root's first stage copies piece k in, the readers' stage
// copies it out; the root's second copies it to its own output once published.
common::Status broadcastPieces(CollectiveSync& sync, const uint8_t* root_in, uint8_t* data,
                               size_t bytes, int root) {
  SegmentWalk walk(sync, bytes, 1, static_cast<size_t>(sync.segment().chunkBytes()), root);
  const size_t piece = walk.piece();
  auto length = [&](uint64_t k) { return walk.pieceLength(bytes, k); };
  if (sync.index() != root) {
    return walk.run([&](uint64_t k) {
      std::memcpy(data + k * piece, walk.slot(root, k), length(k));
    });
  }
  auto copy_in = [&](uint64_t k) {
    std::memcpy(walk.slot(root, k), root_in + k * piece, length(k));
  };
  if (root_in == data) return walk.run(copy_in);
  return walk.run(copy_in, [&](uint64_t k) {
    std::memcpy(data + k * piece, root_in + k * piece, length(k));
  });
}

// Note [Two-thread reads]
// A single-copy reader's process_vm_readv is bound by the kernel's work per page (pinning the
// root's pages, walking both page tables) more than by memory: one thread read 16 MiB in
// 1.50-1.81 ms and 64 MiB in 9.9-12.5 ms on the 2-vCPU test VM, no faster than the slots
// (1.45-1.53 / 7.9-9.5 ms). The root of a broadcast only waits while its readers read, so
// where the host has two CPUs per reader and the reader may run on two
// (transport::shm::readsOnTwoThreads: 2 x readers <= the CPUs the process could use before any
// binding, common::usableCores; the ranks sharing its CPUs, fake hosts' too, no more than
// those: Note [Yielding spins] B in transport/mesh.cc), a read of at least kTwoThreadMinBytes
// takes the second half on the process's reading thread (transport/shm/helper_read.h) while
// this thread reads the first: np=2 unbound, 0.70-0.81 / 2.8-4.2 ms in a loop whose data
// stays in the VM's 300 MiB L3, ~8 % / 1.3x faster than the slots with fresh data each op
// (benchmarks/RESULTS.md, "Large ops against the copy floor", 2026-12-06). So that is where
// HVD_SINGLE_COPY=auto (the default) reads broadcasts directly: every rank of the host says at
// setup whether it would read on two threads (Mesh, with the share HVD_CPU_BIND=core will give
// it), and the host agrees (Note [Collective setup] H); under auto only broadcasts the user
// asked for, of at least kTwoThreadMinBytes, of the process's own memory (a staged device
// op's pinned buffer may not be readable by a peer's process_vm_readv; a step of another
// collective keeps that collective's path: `needs` in broadcastShm). Each read still asks
// again with the thread's mask then (a user may have narrowed it): the number of threads is
// this rank's own choice, the op is the same on every rank either way. Allgather's and
// alltoall's own single-copy reads stay on one thread, and on the slots unless
// HVD_SINGLE_COPY=1: every rank reads there, so no CPU is idle.
constexpr size_t kTwoThreadMinBytes = 1 << 20;  // below, the hand-off costs what it saves

bool twoThreadReads(const CollectiveSync& sync, size_t bytes, bool cores_outnumbered) {
  if (bytes < kTwoThreadMinBytes) return false;
  cpu_set_t mine;  // (a rank bound to one CPU, HVD_CPU_BIND, would read both halves on it)
  CPU_ZERO(&mine);
  return sched_getaffinity(0, sizeof(mine), &mine) == 0 &&
         transport::shm::readsOnTwoThreads(sync.size(), cores_outnumbered, CPU_COUNT(&mine));
}

// Note [Single-copy ops] in algo/single_copy.cc: the readers copy the root's input straight
// into their output; the root copies only its own output, and returns once all have read.
common::Status broadcastSingleCopy(CollectiveSync& sync, const uint8_t* root_in, uint8_t* data,
                                   size_t bytes, int root, bool cores_outnumbered) {
  const bool is_root = sync.index() == root;
  const bool two_threads = !is_root && twoThreadReads(sync, bytes, cores_outnumbered);
  SingleCopyOp op;
  op.in = is_root ? root_in : nullptr;
  op.bytes = is_root ? bytes : 0;
  op.source = root;
  op.read_by_others = is_root;
  if (is_root && root_in != data) op.local = [&] { std::memcpy(data, root_in, bytes); };
  op.read = [&](int j, const PeerInput& peer) {
    HVD_RETURN_IF_ERROR(checkPeerBlock("broadcast", j, peer.bytes, 0, peer.bytes, bytes));
    return two_threads ? transport::shm::readOnTwoThreads(peer.pid, peer.address, data, bytes)
                       : transport::shm::readPeer(peer.pid, peer.address, data, bytes);
  };
  return runSingleCopy(sync, op);
}

}  // namespace

common::Status broadcastShm(transport::Comm& comm, const void* root_in, void* data,
                            size_t bytes, int root, transport::shm::SingleCopyScope needs) {
  transport::shm::CollectiveSegment* segment = CollectiveSync::segmentFor(comm);
  if (segment == nullptr || static_cast<int>(comm.localMembers().size()) != comm.size()) {
    return common::internalError("shm broadcast: no host collective segment serves this "
                                 "process set of " + std::to_string(comm.size()) + " ranks");
  }
  if (bytes == 0 || comm.size() == 1) return common::Status::ok();
  CollectiveSync sync(comm, segment);
  // Under auto (scope kBroadcast) only what a reader reads on two threads: at least 1 MiB.
  const bool every_op = sync.segment().singleCopy() == transport::shm::SingleCopyScope::kEveryOp;
  if (singleCopyServes(sync, bytes, needs) && (every_op || bytes >= kTwoThreadMinBytes)) {
    return broadcastSingleCopy(sync, static_cast<const uint8_t*>(root_in),
                               static_cast<uint8_t*>(data), bytes,
                               sync.localIndexOf(comm.globalRank(root)),
                               comm.mesh().spinYields());
  }
  return broadcastPieces(sync, static_cast<const uint8_t*>(root_in),
                         static_cast<uint8_t*>(data), bytes,
                         sync.localIndexOf(comm.globalRank(root)));
}

}  // namespace hvd::algo
