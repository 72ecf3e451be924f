// Cross-memory attach: one rank of a host reads a byte range straight out of another rank's
// address space (Linux process_vm_readv), so a host collective can copy each byte once, from
// the peer's input to this rank's output, instead of twice through the collective segment
// (issue #20, part 3). Whether a host may use it is decided once, at setup, by every rank of
// the host together (Note [Single-copy probe] in cross_memory.cc); the verdict lives in the
// CollectiveSegment (singleCopy()), identical on every rank of the host.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/shm/collective_segment.h"

namespace hvd::transport::shm {

// Copies `bytes` bytes at address `remote` of process `pid` into `local`. Partial transfers are
// continued and EINTR retried. Errors say what happened: the peer is gone (ESRCH), the kernel
// refuses (EPERM: ptrace policy or seccomp), or the range is not mapped there (EFAULT). When
// `os_error` is given it receives the failed call's errno (0 on success), so callers decide on
// the code, never on the message's text.
common::Status readPeer(pid_t pid, uint64_t remote, void* local, size_t bytes,
                        int* os_error = nullptr);
// The other way: `bytes` bytes from `local` to address `remote` of process `pid`
// (process_vm_writev; the point-to-point split copy, Note [Split copy] in
// transport/peer_split.cc). The same errors, saying "writing".
common::Status writePeer(pid_t pid, uint64_t remote, const void* local, size_t bytes,
                         int* os_error = nullptr);

// Where a copy done by two parties splits (the point-to-point split copy, a two-thread read):
// half of `bytes`, rounded up to a page so each side copies whole pages; at most `bytes`.
inline uint64_t pageHalf(uint64_t bytes) {
  constexpr uint64_t kPage = 4096;
  const uint64_t half = (bytes / 2 + kPage - 1) / kPage * kPage;
  return half < bytes ? half : bytes;
}

struct SingleCopyRequest {
  int rank = -1;                // global rank
  std::vector<int> host_ranks;  // as CollectiveRequest's
  std::vector<int> fds;         // data socket per global rank
  tcp::Deadline deadline;
};

// Note [Single-copy probe]. Every rank of the host calls it with the same segment (or every
// rank with none); afterwards segment->singleCopy() is the same on all of them, and
// singleCopyReason() says what limits it. Sends nothing where segment->singleCopyWanted() is
// kNone (the host's ranks agreed at setup, Note [Collective setup] H).
common::Status probeSingleCopy(const SingleCopyRequest& request, CollectiveSegment* segment);

// Probes this process ran (exchanged messages for) since it started:
// metrics()["single_copy_probes"], so tests can see when none ran (a host that agreed on none).
uint64_t singleCopyProbes();

}  // namespace hvd::transport::shm
