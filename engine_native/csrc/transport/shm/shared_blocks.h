// Shared blocks: host memory for op outputs that the other ranks of this host can map and
// write into, so an alltoall moves each byte once, from the sender's input straight into the
// receiver's output, instead of into the collective segment and out again (issue #20; Note
// [Shared outputs] in algo/shared_outputs.cc). A block is a memfd mapped MAP_SHARED here; a peer
// maps it by duplicating the owner's descriptor (pidfd_getfd, the same ptrace permission as
// process_vm_readv), once, and keeps the mapping for later ops (Note [Peer block cache] in
// shared_blocks.cc). Whether a host may use them is probed once at setup by all its ranks
// together (Note [Shared-output probe] in shared_blocks.cc).
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "transport/shm/collective_segment.h"
#include "transport/tcp/socket.h"

namespace hvd::transport::shm {

// What a peer needs to find a byte range of one of this process's blocks.
struct SharedBlockRef {
  int64_t fd = -1;        // the owner's descriptor of the block's memfd; -1: not shared
  uint64_t serial = 0;    // unique to the block for the owner's life (a descriptor is reused)
  uint64_t capacity = 0;  // bytes of the block
  uint64_t offset = 0;    // of the range in the block
  // The memfd's identity (fstat): a peer checks the descriptor it took is this block, not
  // whatever the owner opened under the same number after freeing the block.
  uint64_t inode = 0;
  uint64_t device = 0;
};

// A block of `capacity` bytes (a multiple of the page size), or nullptr when the kernel
// refuses a memfd or its mapping (the caller then uses private memory). Any thread.
uint8_t* allocateSharedBlock(size_t capacity);
// Unmaps a block allocateSharedBlock returned and frees its pages (peers that still map it keep
// an empty mapping: a late write from a peer costs a fresh page and never reaches reused
// memory).
void freeSharedBlock(uint8_t* base);
// Whether [p, p + bytes) lies in one live block of this process; fills *ref. Any thread.
bool findSharedBlock(const void* p, size_t bytes, SharedBlockRef* ref);
// Marks the block holding `p` as seen by peers during an op that failed: a peer may still write
// into it, so the output pool frees it instead of handing it to a later op.
void retireSharedBlock(const void* p);
bool sharedBlockRetired(const uint8_t* base);

// Where block `ref` of process `pid` lies in this process, mapping it on first use (Note [Peer
// block cache]). `op`: a number unique to the calling op; no mapping handed out for the same
// op is dropped to make room. Errors name the cause: the peer is gone, the kernel refuses, the
// descriptor is not the block announced.
common::Status mapPeerBlock(pid_t pid, const SharedBlockRef& ref, uint64_t op, uint8_t** base);
// Mappings of peers' blocks this process ever made (metrics, tests).
uint64_t peerBlockMaps();

struct SharedOutputRequest {
  int rank = -1;                // global rank
  std::vector<int> host_ranks;  // as CollectiveRequest's
  std::vector<int> fds;         // data socket per global rank
  bool wanted = true;           // HVD_SHARED_OUTPUTS on this rank
  tcp::Deadline deadline;
};

// Note [Shared-output probe]. Every rank of a host with a collective segment calls it (a host
// without one sends nothing); afterwards segment->sharedOutputs() is the same on all of them,
// and sharedOutputsReason() says why it is off.
common::Status probeSharedOutputs(const SharedOutputRequest& request,
                                  CollectiveSegment* segment);

}  // namespace hvd::transport::shm
