// Shared blocks (transport/shm/shared_blocks.h).
//
// Note [Peer block cache]
// Mapping a peer's block costs two syscalls to get its descriptor, an mmap, and then one
// minor fault per page on the first write through the new mapping (a 16 MiB block: 4096
// faults, ~1 ms on the 2-core VM, as long as the copy itself). Outputs come from a pool (Note
// [Host output reuse] in runtime/host_output_pool.cc), so a training loop's alltoalls land in
// the same few blocks op after op: each rank keeps its mappings of peers' blocks, keyed by
// (pid, serial), and pays the mapping and the faults once per block. The key never names
// another block: serials are unique for the owner's life (its descriptor numbers are not) and
// begin with a random prefix, so a later process that reuses the pid does not match. The cache
// holds at most kMaxPeerBytes of mappings, dropping the least recently used, but never one the
// op in progress was handed (an op writing into several large outputs may go over the bound
// until it ends; dropping one would leave the op writing through an unmapped pointer). A cached
// mapping holds no memory of its own once the owner frees the block: freeSharedBlock punches
// the block's pages out of the memfd, whoever still maps it. On a miss the descriptor taken
// from the owner is checked against the inode the owner published, so a number the owner
// reused for another file after freeing the block is never mapped.
//
// Note [Shared-output probe]
// Writing into a peer's output needs its descriptor (pidfd_getfd: ptrace-attach permission on
// the peer, as process_vm_readv; refused under a Yama ptrace_scope >= 1 or a seccomp profile
// that blocks pidfd_open/pidfd_getfd, as older container runtimes' do) and memfds. None of that
// can be known without trying, and a host's ranks must agree: one rank writing into a peer's
// output while the peer waits for it in the segment's slots would hang. So once per host
// segment, after Note [Collective setup], every rank of a host with a segment:
//   J. allocates a one-page block holding a word derived from its local index, publishes the
//      block's SharedBlockRef in its PeerRegion, and passes the leader's barrier
//      (transport/shm/host_agreement.h);
//   K. maps every peer's probe block (uncached), checks the word, and unmaps it; its verdict
//      is fine, or why not (HVD_SHARED_OUTPUTS=0 on this rank, the kernel refused, a wrong
//      word, a test forced it);
//   L. agrees with the others on the first refusal (host_agreement.h) and sets the segment's
//      mode from it. The probe block is freed only after the verdict: every read is done.
// Cost: a few syscalls and two socket round trips per host at init; the default runs it
// because the default uses the result.
#include "transport/shm/shared_blocks.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <random>

#include "common/test_switch.h"
#include "transport/shm/host_agreement.h"

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_pidfd_getfd
#define SYS_pidfd_getfd 438
#endif

namespace hvd::transport::shm {

using common::Status;

namespace {

constexpr size_t kMaxPeerBytes = size_t{2} << 30;  // Note [Peer block cache]

// kMaxPeerBytes, or HVD_TEST_PEER_BLOCK_CACHE_BYTES (tests only: a bound small enough to reach).
size_t peerCacheBytes() {
  static const size_t bytes = [] {
    const char* raw = HVD_TEST_SWITCH("PEER_BLOCK_CACHE_BYTES");
    return raw == nullptr ? kMaxPeerBytes : static_cast<size_t>(std::strtoull(raw, nullptr, 10));
  }();
  return bytes;
}
// Live blocks hold a descriptor each (outputs the user keeps): at most this many, and at most
// an eighth of RLIMIT_NOFILE, so outputs never use up the process's descriptors; past that
// outputs are private and the op takes the slots (Note [Shared outputs]).
constexpr size_t kMaxLiveBlocks = 256;
constexpr uint64_t kProbeMagic = 0x54554f4452414853ull;  // "SHARDOUT"-ish, xor local index

struct OwnBlock {
  int fd = -1;
  uint64_t serial = 0;
  size_t capacity = 0;
  uint64_t inode = 0;
  uint64_t device = 0;
  bool retired = false;
};

struct PeerBlock {
  uint8_t* base = nullptr;
  size_t capacity = 0;
  uint64_t last_use = 0;
  uint64_t op = 0;  // the last op handed this mapping: never dropped during that op
};

std::mutex g_own_mutex;
auto* g_own = new std::map<uintptr_t, OwnBlock>();  // by base address; never destroyed
std::mutex g_peer_mutex;
auto* g_peers = new std::map<std::pair<pid_t, uint64_t>, PeerBlock>();
size_t g_peer_bytes = 0;
uint64_t g_peer_clock = 0;
std::atomic<uint64_t> g_peer_maps{0};

uint64_t nextSerial() {
  static const uint64_t prefix = [] {
    std::random_device device;
    return (static_cast<uint64_t>(device()) << 32) & ~uint64_t{0xffffffff};
  }();
  static std::atomic<uint32_t> counter{0};
  return prefix | counter.fetch_add(1, std::memory_order_relaxed);
}

std::string peerError(const char* what, pid_t pid, int err) {
  const std::string who = "rank process " + std::to_string(pid);
  switch (err) {
    case ESRCH: return std::string(what) + " of " + who + ": the process is gone (ESRCH)";
    case EPERM:
      return std::string(what) + " of " + who + ": not permitted (EPERM: a Yama ptrace_scope "
             ">= 1 or a seccomp profile); set HVD_SHARED_OUTPUTS=0";
    case EBADF:
      return std::string(what) + " of " + who + ": no such descriptor there (EBADF); its "
             "output block was freed during the op";
    default: return std::string(what) + " of " + who + ": " + std::strerror(err);
  }
}

// Maps the peer's block without the cache. *os_error, when given, receives the failed call's
// errno (0 on success), so callers decide on the code, never on the message's text.
Status mapUncached(pid_t pid, const SharedBlockRef& ref, uint8_t** base,
                   int* os_error = nullptr) {
  int ignored = 0;
  int& err = os_error != nullptr ? *os_error : ignored;
  err = 0;
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, pid, 0));
  if (pidfd < 0) {
    err = errno;
    return common::internalError(peerError("opening", pid, err));
  }
  const int fd = static_cast<int>(
      ::syscall(SYS_pidfd_getfd, pidfd, static_cast<int>(ref.fd), 0));
  err = fd < 0 ? errno : 0;
  ::close(pidfd);
  if (fd < 0) return common::internalError(peerError("taking the output block", pid, err));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<uint64_t>(st.st_ino) != ref.inode ||
      static_cast<uint64_t>(st.st_dev) != ref.device ||
      static_cast<uint64_t>(st.st_size) < ref.capacity) {
    ::close(fd);
    return common::internalError("rank process " + std::to_string(pid) + "'s descriptor " +
                                 std::to_string(ref.fd) + " is not the output block it "
                                 "published (freed during the op?)");
  }
  void* mapped = ::mmap(nullptr, ref.capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  err = mapped == MAP_FAILED ? errno : 0;
  ::close(fd);
  if (mapped == MAP_FAILED) {
    return common::internalError(peerError("mapping the output block", pid, err));
  }
  *base = static_cast<uint8_t*>(mapped);
  return Status::ok();
}

enum Refusal : uint32_t { kFine = 0, kNotWanted = 1, kNotPermitted = 2, kFailed = 3, kForced = 4 };

bool forcedToFail() {
  const char* raw = HVD_TEST_SWITCH("SHARED_OUTPUTS_PROBE_FAIL");
  return raw != nullptr && std::strcmp(raw, "1") == 0;
}

std::string explain(const ProbeVerdict& v) {
  const std::string who = "rank " + std::to_string(v.rank);
  const std::string whom = "rank " + std::to_string(v.peer);
  switch (v.refusal) {
    case kNotWanted: return who + " has HVD_SHARED_OUTPUTS=0";
    case kNotPermitted:
      return who + " may not map " + whom + "'s blocks (EPERM: a Yama ptrace_scope >= 1 or a "
                   "seccomp profile that blocks pidfd_getfd)";
    case kFailed: return who + " could not map " + whom + "'s probe block or memfds";
    case kForced: return who + " failed its probe on purpose (a test switch)";
    default: return "";
  }
}

size_t liveBlockLimit() {
  struct rlimit limit {};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) {
    return kMaxLiveBlocks;
  }
  return std::min(kMaxLiveBlocks, static_cast<size_t>(limit.rlim_cur / 8));
}

}  // namespace

uint8_t* allocateSharedBlock(size_t capacity) {
  {
    std::lock_guard<std::mutex> lock(g_own_mutex);
    if (g_own->size() >= liveBlockLimit()) return nullptr;
  }
  const int fd = ::memfd_create("hvd-output", MFD_CLOEXEC);
  if (fd < 0) return nullptr;
  if (::ftruncate(fd, static_cast<off_t>(capacity)) != 0) {
    ::close(fd);
    return nullptr;
  }
  void* mapped = ::mmap(nullptr, capacity, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (mapped == MAP_FAILED) {
    ::close(fd);
    return nullptr;
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    ::munmap(mapped, capacity);
    ::close(fd);
    return nullptr;
  }
  OwnBlock block;
  block.fd = fd;
  block.serial = nextSerial();
  block.capacity = capacity;
  block.inode = static_cast<uint64_t>(st.st_ino);
  block.device = static_cast<uint64_t>(st.st_dev);
  std::lock_guard<std::mutex> lock(g_own_mutex);
  (*g_own)[reinterpret_cast<uintptr_t>(mapped)] = block;
  return static_cast<uint8_t*>(mapped);
}

void freeSharedBlock(uint8_t* base) {
  OwnBlock block;
  {
    std::lock_guard<std::mutex> lock(g_own_mutex);
    auto it = g_own->find(reinterpret_cast<uintptr_t>(base));
    if (it == g_own->end()) return;
    block = it->second;
    g_own->erase(it);
  }
  // The pages go now, whoever still maps the block (Note [Peer block cache]).
  ::fallocate(block.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 0,
              static_cast<off_t>(block.capacity));
  ::munmap(base, block.capacity);
  ::close(block.fd);
}

bool findSharedBlock(const void* p, size_t bytes, SharedBlockRef* ref) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_own_mutex);
  auto it = g_own->upper_bound(at);
  if (it == g_own->begin()) return false;
  --it;
  const OwnBlock& block = it->second;
  if (at - it->first + bytes > block.capacity) return false;
  ref->fd = block.fd;
  ref->serial = block.serial;
  ref->capacity = block.capacity;
  ref->offset = at - it->first;
  ref->inode = block.inode;
  ref->device = block.device;
  return true;
}

void retireSharedBlock(const void* p) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lock(g_own_mutex);
  auto it = g_own->upper_bound(at);
  if (it == g_own->begin()) return;
  --it;
  if (at - it->first < it->second.capacity) it->second.retired = true;
}

bool sharedBlockRetired(const uint8_t* base) {
  std::lock_guard<std::mutex> lock(g_own_mutex);
  auto it = g_own->find(reinterpret_cast<uintptr_t>(base));
  return it != g_own->end() && it->second.retired;
}

Status mapPeerBlock(pid_t pid, const SharedBlockRef& ref, uint64_t op, uint8_t** base) {
  const std::pair<pid_t, uint64_t> key{pid, ref.serial};
  std::lock_guard<std::mutex> lock(g_peer_mutex);
  auto it = g_peers->find(key);
  if (it != g_peers->end() && it->second.capacity >= ref.capacity) {
    it->second.last_use = ++g_peer_clock;
    it->second.op = op;
    *base = it->second.base;
    return Status::ok();
  }
  uint8_t* mapped = nullptr;
  HVD_RETURN_IF_ERROR(mapUncached(pid, ref, &mapped));
  g_peer_maps.fetch_add(1, std::memory_order_relaxed);
  if (it != g_peers->end()) {  // same serial, larger than the mapping: cannot happen, but safe
    ::munmap(it->second.base, it->second.capacity);
    g_peer_bytes -= it->second.capacity;
    g_peers->erase(it);
  }
  while (g_peer_bytes + ref.capacity > peerCacheBytes()) {
    auto oldest = g_peers->end();
    for (auto i = g_peers->begin(); i != g_peers->end(); ++i) {
      if (i->second.op == op) continue;  // this op holds it
      if (oldest == g_peers->end() || i->second.last_use < oldest->second.last_use) oldest = i;
    }
    if (oldest == g_peers->end()) break;  // all in use by this op: over the bound until it ends
    ::munmap(oldest->second.base, oldest->second.capacity);
    g_peer_bytes -= oldest->second.capacity;
    g_peers->erase(oldest);
  }
  (*g_peers)[key] = PeerBlock{mapped, ref.capacity, ++g_peer_clock, op};
  g_peer_bytes += ref.capacity;
  *base = mapped;
  return Status::ok();
}

uint64_t peerBlockMaps() { return g_peer_maps.load(std::memory_order_relaxed); }

Status probeSharedOutputs(const SharedOutputRequest& request, CollectiveSegment* segment) {
  if (segment == nullptr) return Status::ok();
  const int n = static_cast<int>(request.host_ranks.size());
  int self = -1;
  HVD_RETURN_IF_ERROR(hostIndexOf(request.host_ranks, request.rank, segment->localSize(),
                                  "shared-output", &self));
  // J: this rank's probe block, published, then the leader's barrier.
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  uint8_t* block = allocateSharedBlock(page);
  SharedBlockRef own_ref;
  if (block != nullptr && findSharedBlock(block, page, &own_ref)) {
    const uint64_t word = kProbeMagic ^ static_cast<uint64_t>(self);
    std::memcpy(block, &word, sizeof(word));
  }
  PeerRegion* own = segment->region(self);
  own->out_serial.store(own_ref.serial, std::memory_order_relaxed);
  own->out_capacity.store(own_ref.capacity, std::memory_order_relaxed);
  own->out_inode.store(own_ref.inode, std::memory_order_relaxed);
  own->out_device.store(own_ref.device, std::memory_order_relaxed);
  own->out_fd.store(own_ref.fd, std::memory_order_release);
  const Status passed =
      hostBarrier(request.host_ranks, request.fds, self, request.deadline);
  if (!passed.isOk() && block != nullptr) freeSharedBlock(block);
  HVD_RETURN_IF_ERROR(passed);
  // K: this rank's verdict.
  ProbeVerdict mine;
  mine.rank = request.rank;
  if (!request.wanted) {
    mine.refusal = kNotWanted;
  } else if (own_ref.fd < 0) {
    mine.refusal = kFailed;  // no memfd here: explained as its own probe block
    mine.peer = request.rank;
  } else if (forcedToFail()) {
    mine.refusal = kForced;
  }
  for (int i = 0; i < n && mine.refusal == kFine; ++i) {
    if (i == self) continue;
    const PeerRegion* region = segment->region(i);
    SharedBlockRef ref;
    ref.fd = region->out_fd.load(std::memory_order_acquire);
    ref.serial = region->out_serial.load(std::memory_order_relaxed);
    ref.capacity = region->out_capacity.load(std::memory_order_relaxed);
    ref.inode = region->out_inode.load(std::memory_order_relaxed);
    ref.device = region->out_device.load(std::memory_order_relaxed);
    const pid_t pid = segment->peerPid(i);
    uint8_t* theirs = nullptr;
    int err = 0;
    const Status mapped = ref.fd < 0 ? common::internalError("no probe block")
                                     : mapUncached(pid, ref, &theirs, &err);
    uint64_t word = 0;
    if (mapped.isOk()) {
      std::memcpy(&word, theirs, sizeof(word));
      ::munmap(theirs, ref.capacity);
    }
    if (!mapped.isOk() || word != (kProbeMagic ^ static_cast<uint64_t>(i))) {
      mine.refusal = err == EPERM ? kNotPermitted : kFailed;
      mine.peer = request.host_ranks[static_cast<size_t>(i)];
    }
  }
  // L: one verdict for the host; the probe blocks go only after every rank's reads.
  ProbeVerdict host;
  const Status agreed =
      agreeOnVerdict(request.host_ranks, request.fds, self, mine, &host, request.deadline);
  if (block != nullptr) freeSharedBlock(block);
  HVD_RETURN_IF_ERROR(agreed);
  segment->setSharedOutputs(host.refusal == kFine, explain(host));
  return Status::ok();
}

}  // namespace hvd::transport::shm
