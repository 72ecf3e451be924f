// Cross-memory attach (transport/shm/cross_memory.h).
//
// Note [Single-copy probe]
// process_vm_readv needs the kernel's ptrace-read permission on the peer: same uid, and no
// Yama ptrace_scope >= 1 (which allows only ancestors), no seccomp profile that blocks the
// call (Docker's default did before 19.03), no peer that made itself non-dumpable. None of
// that can be known without trying, and a host's ranks must all take the same path (an op
// that reads a peer's input directly and an op that waits for the peer to copy into its slot
// do not mix). So once per host segment, after Note [Collective setup] and only where the
// host's ranks agreed there on a scope that reads (HVD_SINGLE_COPY=1 on every rank; auto, the
// default, where every rank would read a broadcast on two threads; otherwise no probe message
// is sent), over the same sockets, with the host's leader L and every other rank P:
//   J. every rank writes (pid, address, 8) of a probe word holding a value derived from its
//      local index into its PeerRegion; P then writes one byte to L, and L, having read all
//      of them, writes one byte back to every P: every region is now published.
//   K. every rank reads every other rank's probe word with readPeer and checks its value; it
//      sends L a verdict (kind, rank): 0 = fine, else why not (the kernel refused, the read
//      failed, a test forced it).
//   L. L writes the first refusal (or 0) to every P; every rank sets the segment's scope from
//      it (step H's, or none), keeping the threshold step H gave (L's
//      HVD_SINGLE_COPY_MIN_BYTES: one threshold per host, since ranks that picked different
//      paths for one op would wait on each other forever). The probe word lives on this
//      function's stack until the verdict, which comes only after every rank has finished its
//      reads.
// Cost: a few syscalls and two socket round trips per host, once per job.
#include "transport/shm/cross_memory.h"

#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/test_switch.h"
#include "transport/shm/host_agreement.h"

namespace hvd::transport::shm {

using common::Status;

namespace {

constexpr uint64_t kProbeMagic = 0x45424f5250435648ull;  // "HVDCPROBE"-ish, xor local index

std::atomic<uint64_t> g_probes{0};

enum Refusal : uint32_t {
  kFine = 0,
  kNotPermitted = 2,  // EPERM: ptrace policy or seccomp
  kReadFailed = 3,    // any other error, or a wrong value
  kForced = 4,        // HVD_TEST_SINGLE_COPY_PROBE_FAIL=1 on that rank (tests only)
};

using Verdict = ProbeVerdict;  // peer: the rank it could not read (kNotPermitted, kReadFailed)

std::string explain(const Verdict& v) {
  const std::string who = "rank " + std::to_string(v.rank);
  const std::string whom = "rank " + std::to_string(v.peer);
  switch (v.refusal) {
    case kNotPermitted:
      return who + " may not read " + whom + "'s memory (EPERM: a Yama ptrace_scope >= 1, a "
                   "seccomp profile that blocks process_vm_readv, or a non-dumpable process); "
                   "host collectives copy through the shared segment";
    case kReadFailed: return who + " could not read " + whom + "'s probe word";
    case kForced: return who + " failed its probe on purpose (a test switch)";
    default: return "";
  }
}

bool forcedToFail() {
  const char* raw = HVD_TEST_SWITCH("SINGLE_COPY_PROBE_FAIL");
  return raw != nullptr && std::strcmp(raw, "1") == 0;
}

// Step K on this rank: kFine, or the refusal with v->peer the rank it could not read.
void probePeers(const CollectiveSegment& segment, const SingleCopyRequest& request, int self,
                Verdict* v) {
  for (int i = 0; i < segment.localSize(); ++i) {
    if (i == self) continue;
    const PeerRegion* region = segment.region(i);
    uint64_t word = 0;
    int err = 0;
    Status s = readPeer(segment.peerPid(i), region->address.load(std::memory_order_acquire),
                        &word, sizeof(word), &err);
    if (!s.isOk() || word != (kProbeMagic ^ static_cast<uint64_t>(i))) {
      v->refusal = err == EPERM ? kNotPermitted : kReadFailed;
      v->peer = request.host_ranks[static_cast<size_t>(i)];
      return;
    }
  }
}

}  // namespace

namespace {

// One mechanism for both directions: process_vm_readv or process_vm_writev until every byte
// moved, EINTR retried, the error named with the direction and the range.
Status movePeer(bool write, pid_t pid, uint64_t remote, void* local, size_t bytes,
                int* os_error) {
  if (os_error != nullptr) *os_error = 0;
  auto* mine = static_cast<uint8_t*>(local);
  size_t done = 0;
  while (done < bytes) {
    struct iovec here {mine + done, bytes - done};
    struct iovec there {reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t n = write ? ::process_vm_writev(pid, &here, 1, &there, 1, 0)
                            : ::process_vm_readv(pid, &here, 1, &there, 1, 0);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    const int err = n == 0 ? EFAULT : errno;  // 0 bytes: the rest is not mapped there
    if (err == EINTR) continue;
    if (os_error != nullptr) *os_error = err;
    const std::string where = std::string(write ? "writing " : "reading ") +
                              std::to_string(bytes - done) + " bytes at 0x" + [&] {
      char hex[32];
      std::snprintf(hex, sizeof(hex), "%llx", static_cast<unsigned long long>(remote + done));
      return std::string(hex);
    }() + " of process " + std::to_string(pid);
    switch (err) {
      case ESRCH:
        return common::internalError(where + ": the process is gone (ESRCH); a rank of this "
                                     "host exited during the op");
      case EPERM:  // (a read serves collectives and point-to-point, a write the latter)
        return common::internalError(
            where + ": not permitted (EPERM); allow ptrace access between the job's "
            "processes, or turn these copies off: " +
            std::string(write ? "HVD_P2P_SPLIT_MIN_BYTES=0"
                              : "HVD_SINGLE_COPY=0 (collectives), HVD_P2P_SPLIT_MIN_BYTES=0 "
                                "(point-to-point)"));
      case EFAULT:
        return common::internalError(where + ": the range is not mapped in that process "
                                     "(EFAULT); its buffer was freed during the op");
      default:
        return common::internalError(where + ": " + std::strerror(err));
    }
  }
  return Status::ok();
}

}  // namespace

Status readPeer(pid_t pid, uint64_t remote, void* local, size_t bytes, int* os_error) {
  return movePeer(/*write=*/false, pid, remote, local, bytes, os_error);
}

Status writePeer(pid_t pid, uint64_t remote, const void* local, size_t bytes, int* os_error) {
  return movePeer(/*write=*/true, pid, remote, const_cast<void*>(local), bytes, os_error);
}

uint64_t singleCopyProbes() { return g_probes.load(std::memory_order_relaxed); }

Status probeSingleCopy(const SingleCopyRequest& request, CollectiveSegment* segment) {
  if (segment == nullptr || segment->singleCopyWanted() == SingleCopyScope::kNone) {
    return Status::ok();
  }
  g_probes.fetch_add(1, std::memory_order_relaxed);
  int self = -1;
  HVD_RETURN_IF_ERROR(hostIndexOf(request.host_ranks, request.rank, segment->localSize(),
                                  "single-copy", &self));
  // J: publish the probe word, then the leader's barrier.
  volatile uint64_t word = kProbeMagic ^ static_cast<uint64_t>(self);
  PeerRegion* own = segment->region(self);
  own->address.store(reinterpret_cast<uint64_t>(&word), std::memory_order_relaxed);
  own->bytes.store(sizeof(word), std::memory_order_release);
  HVD_RETURN_IF_ERROR(hostBarrier(request.host_ranks, request.fds, self, request.deadline));
  // K: this rank's own verdict.
  Verdict mine;
  mine.rank = request.rank;
  if (forcedToFail()) {
    mine.refusal = kForced;
  } else {
    probePeers(*segment, request, self, &mine);
  }
  // L: the leader gathers, picks the first refusal, tells everyone.
  Verdict host;
  HVD_RETURN_IF_ERROR(
      agreeOnVerdict(request.host_ranks, request.fds, self, mine, &host, request.deadline));
  segment->setProbed(host.refusal == kFine, explain(host));
  return Status::ok();
}

}  // namespace hvd::transport::shm
