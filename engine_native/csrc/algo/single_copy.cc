// Single-copy host collectives (algo/single_copy.h).
//
// Note [Single-copy ops]
// An op is one "chunk" g = sync.released() in the counters' numbering (Note [Host pipeline] in
// algo/allreduce_shm.cc), so it mixes with the slot-based ops before and after it:
//   1. every rank writes its PeerRegion (pid, input address, bytes, layout) and publishes
//      kPosted = g + 1 (the release store orders the region before the counter);
//   2. it copies its own part (the peers' reads run meanwhile on the other cores);
//   3. it waits for kPosted >= g + 1 of the ranks it reads, reads each peer's region and
//      copies the peer's bytes into its output with process_vm_readv;
//   4. it publishes kReduced = kReleased = g + 1, and if anyone reads its input waits for
//      every other rank's kReleased >= g + 1 before returning, so the caller cannot free or
//      reuse the input while a peer still reads it (a rank that only reads returns at once).
//   5. a read that fails (EPERM, EFAULT, a block that disagrees) ends this rank's reads: it
//      writes g + 1 into its region's `failed`, publishes kReduced = kReleased = g + 1 (it
//      reads nothing more, so every input it read is free again), waits as step 4 does when
//      its own input is read (the peers still reading it find it there) and returns the error. A
//      rank waiting in step 4 then wakes at once and, seeing `failed` = g + 1 on a peer,
//      ends its op with an error naming that rank, instead of waiting for the abort that
//      the failed rank fans out, or for HVD_TIMEOUT. The owner still never returns while a
//      reader may be reading: `failed` is written only after the reader's last read returned.
// Every counter ends the op at g + 1 on every rank (rule 1) and a rank's region is rewritten
// only by its next op, after everyone released this one (rule 2 of the same note). Waits are
// CollectiveSync's: a short spin, then a futex sleep that abort() and a lost peer end. A
// peer that dies while being read makes process_vm_readv fail with ESRCH: the reader's op
// ends with that error; the others see the lost peer in their wait.
//
// Prediction (2-core AMD VM, 16 MiB per rank): bytes copied per rank, before -> after:
//   broadcast   root S (+S own output when not in place) -> 0 (+S); reader S -> S, but the
//               root no longer copies in, so the op is one copy deep instead of two:
//               np=2 64 MiB from 0.48x to ~1x of MPICH (MPICH's own method).
//   allgather   every rank S in + (L-1)S out -> (L-1)S read (+S own): np=2 from 0.83x to ~1x.
//   alltoall    (the own block + (L-1) blocks in + (L-1) out) -> (L-1) blocks read (+ own):
//               np=2 16 MiB from 0.56x, np=4 64 MiB from 0.51x to ~1x.
// Wake-ups per op: one (posted) per reader, one more (released) per rank that was read;
// against one per piece (64 per 16 MiB at 256 KiB pieces) on the slot path.
//
// HVD_TEST_SINGLE_COPY_READ_DELAY_MS (tests only): a reader sleeps that long after the peers
// posted, before its first read, so tests can see that the owners wait for it (step 4).
//
// Note [Single-copy threshold]
// process_vm_readv pins the peer's source pages for each call (get_user_pages) and faults in
// the reader's fresh output pages from inside the kernel, 4 KiB at a time; on the 2-core
// Firecracker VM that is a fixed cost per op, so at 1-2 MiB single-copy was slower than the
// slots (whose 256 KiB pieces stay in the L3), about even at 8 MiB, and ahead only at 16 and
// 64 MiB (benchmarks/history/RESULTS-parts-1-10.md, "Single-copy reads between ranks of one
// host (issue #20, part 3)"). So the default HVD_SINGLE_COPY_MIN_BYTES is 16 MiB per
// transfer; a machine with cheaper faults (bare metal, huge pages) may lower it.
#include "algo/single_copy.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "common/test_switch.h"
#include "transport/shm/cross_memory.h"

namespace hvd::algo {

using transport::shm::CollectiveSync;
using transport::shm::PeerRegion;
using transport::shm::Stage;

namespace {
std::atomic<uint64_t> g_single_copy_ops{0};

// HVD_TEST_SINGLE_COPY_READ_DELAY_MS, read once; 0 when unset.
int readDelayMilliseconds() {
  static const int delay = [] {
    const char* raw = HVD_TEST_SWITCH("SINGLE_COPY_READ_DELAY_MS");
    return raw == nullptr ? 0 : std::max(0, std::atoi(raw));
  }();
  return delay;
}

// Step 5's check on a rank that waited for every release: which peer gave up on op g, if any.
common::Status peerFailures(const CollectiveSync& sync, uint64_t g) {
  for (int j = 0; j < sync.size(); ++j) {
    if (j == sync.index()) continue;
    if (sync.segment().region(j)->failed.load(std::memory_order_acquire) == g) {
      return common::internalError(
          "single-copy op: rank " + std::to_string(sync.globalRankOf(j)) + " of this host "
          "could not read its peers' inputs and ended the op (its own error says why); set "
          "HVD_SINGLE_COPY=0 to copy through the shared segment instead");
    }
  }
  return common::Status::ok();
}
}  // namespace

uint64_t singleCopyOps() { return g_single_copy_ops.load(std::memory_order_relaxed); }

bool singleCopyServes(const CollectiveSync& sync, size_t largest,
                      transport::shm::SingleCopyScope needs) {
  return sync.segment().singleCopy() >= needs && largest >= sync.segment().singleCopyMinBytes();
}

common::Status runSingleCopy(CollectiveSync& sync, const SingleCopyOp& op) {
  g_single_copy_ops.fetch_add(1, std::memory_order_relaxed);
  const uint64_t g = sync.released() + 1;
  const int me = sync.index();
  PeerRegion* own = sync.segment().region(me);
  own->address.store(reinterpret_cast<uint64_t>(op.in), std::memory_order_relaxed);
  own->bytes.store(op.bytes, std::memory_order_relaxed);
  own->layout.store(op.layout, std::memory_order_relaxed);
  sync.publish({Stage::kPosted}, g);  // release: the region before the counter
  if (op.local) op.local();
  const bool reads = op.source < 0 || op.source != me;
  if (reads) {
    HVD_RETURN_IF_ERROR(op.source < 0 ? sync.waitAll(Stage::kPosted, g)
                                      : sync.waitFor(op.source, Stage::kPosted, g));
    if (readDelayMilliseconds() > 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(readDelayMilliseconds()));
    }
    for (int j = 0; j < sync.size(); ++j) {
      if (j == me || (op.source >= 0 && j != op.source)) continue;
      const PeerRegion* region = sync.segment().region(j);
      PeerInput peer;
      peer.pid = sync.segment().peerPid(j);
      peer.address = region->address.load(std::memory_order_acquire);
      peer.bytes = region->bytes.load(std::memory_order_acquire);
      peer.layout = region->layout.load(std::memory_order_acquire);
      const common::Status read = op.read(j, peer);
      if (!read.isOk()) {  // step 5
        own->failed.store(g, std::memory_order_relaxed);
        sync.publish({Stage::kReduced, Stage::kReleased}, g);  // release: `failed` first
        // Peers may still be reading this rank's input: the caller may free it only after.
        if (op.read_by_others) (void)sync.waitAll(Stage::kReleased, g);
        return common::Status(read.code(), "rank " + std::to_string(sync.globalRankOf(me)) +
                                               ", single-copy read of rank " +
                                               std::to_string(sync.globalRankOf(j)) +
                                               "'s input: " + read.message());
      }
    }
  }
  sync.publish({Stage::kReduced, Stage::kReleased}, g);
  if (!op.read_by_others) return common::Status::ok();
  HVD_RETURN_IF_ERROR(sync.waitAll(Stage::kReleased, g));
  return peerFailures(sync, g);
}

}  // namespace hvd::algo
