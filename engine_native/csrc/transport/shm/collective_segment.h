// CollectiveSegment: one POSIX shared-memory segment per host, mapped by every rank of the host,
// that host-local collectives (algo/allreduce_shm.cc) stage chunks through. Created by the
// host's lowest rank and mapped by the others once, during Mesh::connect (Note [Collective
// setup] in collective_segment.cc); reused by every op. Per local rank it holds three chunk
// counters (written only by that rank), a doorbell (Note [Doorbell ordering] in segment.cc),
// `depth` slots of `chunk_bytes` and its part of the one-round board (two posts). Touched only by the background threads of the host's
// ranks, plus Mesh::abort, which rings its own rank's doorbell.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/check.h"
#include "common/status.h"
#include "transport/shm/segment.h"
#include "transport/shm/shared_mapping.h"
#include "transport/tcp/socket.h"

namespace hvd::transport::shm {

// The three per-chunk milestones of a local rank (Note [Host pipeline] in
// algo/allreduce_shm.cc). Each counter holds "chunks ever passed this milestone".
enum class Stage : int { kPosted = 0, kReduced = 1, kReleased = 2 };
constexpr int kStageCount = 3;

// Which host ops read peers' inputs directly (Note [Single-copy ops] in algo/single_copy.cc),
// the same on every rank of the host (Note [Collective setup] H, Note [Single-copy probe]).
enum class SingleCopyScope : uint8_t {
  kNone = 0,
  kBroadcast = 1,  // HVD_SINGLE_COPY=auto: broadcasts, where their readers read on two threads
  kEveryOp = 2,    // HVD_SINGLE_COPY=1: broadcast, allgather and alltoall
};

// What a rank asks for at setup (its ack's second byte, Note [Collective setup] G).
enum class SingleCopyWish : uint8_t {
  kOff = 0,           // HVD_SINGLE_COPY=0
  kEveryOp = 1,       // HVD_SINGLE_COPY=1
  kBroadcast = 2,     // auto, and this rank would read a broadcast on two threads
  kNotTwoThreads = 3  // auto, and it would not (Note [Two-thread reads] in broadcast_shm.cc)
};
constexpr uint8_t kLastSingleCopyWish = 3;
SingleCopyScope scopeOf(SingleCopyWish wish);
// This rank's wish: HVD_SINGLE_COPY `setting` (auto, on or off); under auto, whether it would
// read a broadcast on two threads on the CPUs it will run on (`binds`: HVD_CPU_BIND=core).
SingleCopyWish singleCopyWish(const std::string& setting, bool binds, int host_ranks,
                              bool cores_outnumbered);

// Where a local rank's input lies in its own address space, for peers that read it with
// process_vm_readv (transport/shm/cross_memory.h), and where its output lies, for peers that
// write into it (transport/shm/shared_blocks.h). Written only by its owner before it posts.
// Which process to read or take descriptors from is never in here: any process that maps the
// segment could rewrite it, so the pid comes from the bootstrap (CollectiveSegment::peerPid).
struct PeerRegion {
  std::atomic<uint64_t> address;
  std::atomic<uint64_t> bytes;
  std::atomic<uint64_t> layout;  // an op-defined table in the owner (alltoall's offsets)
  // The op number (its chunk g + 1) whose reads this rank gave up on: written before it
  // releases that op, so a rank waiting for the release learns the op failed there (Note
  // [Single-copy ops] in algo/single_copy.cc). Never equal to a later op's number.
  std::atomic<uint64_t> failed;
  // Where this rank's output of the op lies, for peers that write into it (Note [Shared
  // outputs] in algo/shared_outputs.cc): a transport/shm/shared_blocks.h SharedBlockRef
  // (out_fd -1: not in a shared block) and the output's bytes.
  std::atomic<int64_t> out_fd;
  std::atomic<uint64_t> out_serial;
  std::atomic<uint64_t> out_capacity;
  std::atomic<uint64_t> out_offset;
  std::atomic<uint64_t> out_inode;
  std::atomic<uint64_t> out_device;
  std::atomic<uint64_t> out_bytes;
};

// A local rank's part of the one-round board (Note [One round] in runtime/one_round.cc): the
// round it posted last, its board's epoch and whether it is closed in it, and what it asked
// for at setup. Written only by its owner; `wish` before the host's verdict (Note [Collective
// setup] G, H), so every rank reads every wish once the segment is agreed.
struct BoardHeader {
  std::atomic<uint64_t> posted;  // rounds start at 1 and only grow; 0: none yet
  // epoch << 1 | closed (Note [One round] F, J), one word so a reader sees both at once; or
  // kBoardGone: this rank posts never again (shutdown, failure)
  std::atomic<uint64_t> state;
  std::atomic<uint32_t> wish;  // HVD_ONE_ROUND_BYTES of this rank (0: off)
};
constexpr uint64_t kBoardGone = ~uint64_t{0};
// One post of the board: two per rank, round r in slot r % 2 (why two suffice: the Note).
constexpr uint64_t kBoardSlotBytes = 32 << 10;
constexpr int64_t kMaxOneRoundBytes = 8 << 10;  // the largest op a post carries

class CollectiveSegment {
 public:
  CollectiveSegment(const CollectiveSegment&) = delete;
  CollectiveSegment& operator=(const CollectiveSegment&) = delete;

  // Creates or maps (SharedMapping::create, ::open) a segment for `local_size` ranks.
  static common::Status create(const std::string& name, int local_size, uint32_t depth,
                               uint64_t chunk_bytes, std::unique_ptr<CollectiveSegment>* out);
  static common::Status open(const std::string& name, int local_size, uint32_t depth,
                             uint64_t chunk_bytes, std::unique_ptr<CollectiveSegment>* out);
  static uint64_t totalBytes(int local_size, uint32_t depth, uint64_t chunk_bytes);

  void unlink() { mapping_.unlink(); }  // removes the name (mappings stay); idempotent
  const std::string& name() const { return mapping_.name(); }
  int localSize() const { return local_size_; }
  uint32_t depth() const { return depth_; }
  uint64_t chunkBytes() const { return chunk_bytes_; }

  // The process of local rank `local`, as the job's authenticated bootstrap announced it
  // (PeerInfo::pid): whom process_vm_readv and pidfd_getfd address. Fixed at setup.
  pid_t peerPid(int local) const { return peer_pids_[static_cast<size_t>(local)]; }
  void setPeerPids(std::vector<pid_t> pids) {
    HVD_CHECK_EQ(pids.size(), static_cast<size_t>(local_size_));
    peer_pids_ = std::move(pids);
  }

  // Slot (chunk % depth) of local rank `local`: chunk_bytes writable by that rank.
  uint8_t* slot(int local, uint64_t chunk) const;
  std::atomic<uint64_t>& counter(int local, Stage stage) const;
  Doorbell* doorbell(int local) const;
  PeerRegion* region(int local) const;
  BoardHeader* boardHeader(int local) const;
  uint8_t* boardSlot(int local, uint64_t round) const;  // kBoardSlotBytes, 64-byte aligned

  // Step H of Note [Collective setup]: the ops every rank of the host asked to read directly;
  // only where some are does Note [Single-copy probe] (cross_memory.cc) run.
  SingleCopyScope singleCopyWanted() const { return single_copy_wanted_; }
  // Records step H's answer: the scope to probe for, `reason` saying what limits it.
  void setSingleCopyWish(SingleCopyScope wanted, std::string reason, uint64_t min_bytes) {
    single_copy_wanted_ = wanted;
    single_copy_reason_ = std::move(reason);
    single_copy_min_bytes_ = min_bytes;
  }
  // Note [Single-copy probe] in cross_memory.cc: which ops read peers' inputs directly, the
  // same on every rank of the host, and (below kEveryOp) why no more.
  SingleCopyScope singleCopy() const { return single_copy_; }
  const std::string& singleCopyReason() const { return single_copy_reason_; }
  // The smallest transfer between two ranks that takes the single-copy path.
  uint64_t singleCopyMinBytes() const { return single_copy_min_bytes_; }
  // The probe's answer: the wanted scope (the reason stays step H's), or none, with `refusal`.
  void setProbed(bool readable, std::string refusal) {
    if (readable) {
      single_copy_ = single_copy_wanted_;
    } else {
      single_copy_ = SingleCopyScope::kNone;
      single_copy_reason_ = std::move(refusal);
    }
  }
  // Note [Shared-output probe] in shared_blocks.cc: whether peers may write ops' outputs
  // directly (outputs in shared blocks), the same on every rank of the host, and when not, why.
  bool sharedOutputs() const { return shared_outputs_; }
  const std::string& sharedOutputsReason() const { return shared_outputs_reason_; }
  void setSharedOutputs(bool on, std::string reason) {
    shared_outputs_ = on;
    shared_outputs_reason_ = std::move(reason);
  }

 private:
  CollectiveSegment() = default;
  uint8_t* base() const { return mapping_.base(); }

  SharedMapping mapping_;
  int local_size_ = 0;  // private copies: never re-read from the shared header
  uint32_t depth_ = 0;
  uint64_t chunk_bytes_ = 0;
  std::vector<pid_t> peer_pids_;  // by local index
  SingleCopyScope single_copy_wanted_ = SingleCopyScope::kNone;
  SingleCopyScope single_copy_ = SingleCopyScope::kNone;
  std::string single_copy_reason_ = "not probed";
  uint64_t single_copy_min_bytes_ = 0;
  bool shared_outputs_ = false;
  std::string shared_outputs_reason_ = "not probed";
};

struct CollectiveRequest {
  int rank = -1;                 // global rank
  std::string job_id;
  std::vector<int> host_ranks;   // global ranks of this host, ascending, self included
  std::vector<int> fds;          // data socket per global rank
  std::vector<pid_t> host_pids;  // per host rank, from the bootstrap (PeerInfo::pid)
  bool wanted = true;            // false when HVD_TRANSPORT=tcp
  uint32_t depth = 4;
  uint64_t piece_bytes = 256 << 10;  // chunk = local size x piece
  SingleCopyWish single_copy_wish = SingleCopyWish::kOff;  // this rank's (Mesh decides it)
  uint64_t single_copy_min_bytes = 16 << 20;  // HVD_SINGLE_COPY_MIN_BYTES; the leader's rules
  uint32_t one_round_bytes = 0;      // HVD_ONE_ROUND_BYTES, this rank's BoardHeader::wish
  tcp::Deadline deadline;
};

// Note [Collective setup]. Sets *out to the mapped segment when every rank of the host agreed
// to use one, else to nullptr (on every rank of the host alike).
common::Status setupCollectiveSegment(const CollectiveRequest& request,
                                      std::unique_ptr<CollectiveSegment>* out);

}  // namespace hvd::transport::shm
