// Note [IPC slot size]: slots start at 1 MiB and grow (to a power of two, at most
// kMaxIpcSlotBytes) at the first op that needs more; an op larger than the largest slot runs
// as several steps (chunks), one host barrier each. Growing re-runs the handle exchange
// (connectIpc), which is collective: `span` — the largest member's input — is computed from
// the response alone, so every member grows at the same op. Before its buffer is freed each
// member waits for its stream (its reads of the peers' slots are done), a barrier (so are
// everyone's reads of its slot), closes its imports, and a second barrier (no peer maps its
// buffer any more; Note [IPC teardown] in ipc_peers.cc): the one place this path blocks the
// host on the device, at most a handful of times per process.
#include "runtime/device_ipc_steps.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "algo/algorithms.h"
#include "runtime/device_path.h"
#include "transport/cuda/device_kernels.h"
#include "transport/mesh.h"

namespace hvd::runtime {

using common::Status;
namespace cuda = transport::cuda;
using transport::nccl::DeviceStream;

namespace {

constexpr size_t kMaxIpcSlotBytes = size_t{64} << 20;
// A step's own copy takes microseconds: poll that long before sleeping (Note [IPC step
// protocol], host-ordered). Bounded, and yielding: ranks may outnumber the cores.
constexpr int kIpcStepSpinMicroseconds = 200;

size_t slotFor(size_t span) {
  size_t bytes = size_t{1} << 20;
  while (bytes < span && bytes < kMaxIpcSlotBytes) bytes <<= 1;
  return bytes;
}

}  // namespace

std::pair<size_t, size_t> overlap(size_t a, size_t an, size_t b, size_t bn) {
  const size_t lo = std::max(a, b), hi = std::min(a + an, b + bn);
  return hi > lo ? std::pair{lo, hi - lo} : std::pair{lo, size_t{0}};
}

DeviceIpcSteps::DeviceIpcSteps(const common::Config& config,
                               std::unique_ptr<cuda::IpcPeers> peers)
    : config_(config), peers_(std::move(peers)) {}

// Note [IPC slot size].
Status DeviceIpcSteps::reserve(transport::Comm& comm, DeviceStream& stream, size_t span) {
  const size_t want = slotFor(span);
  if (want <= peers_->slotBytes()) return Status::ok();
  // Bounded: device-ordered, the stream may wait for a peer's event, or run behind a producer
  // kernel that never ends; an unbounded synchronize() there would outlive abort().
  HVD_RETURN_IF_ERROR(waitForOwnStream(comm, stream, "the reads of the old slots queued "
                                                     "before growing them"));
  HVD_RETURN_IF_ERROR(algo::barrier(comm));  // every member's reads are done
  peers_->closeImported();
  HVD_RETURN_IF_ERROR(algo::barrier(comm));  // no member maps this rank's buffer any more
  const bool host_ordered = peers_->hostOrdered();  // the set's agreed protocol stays
  peers_->freeOwn();                                 // Note [IPC teardown]
  peers_.reset();
  std::string why;
  HVD_RETURN_IF_ERROR(connectIpc(comm, stream, want, host_ordered, &peers_, &why));
  if (peers_ == nullptr) {
    return common::internalError("CUDA IPC: growing the staging buffers to " +
                                 std::to_string(want) + " bytes failed: " + why);
  }
  steps_ = 0;            // fresh events: nothing recorded yet
  last_drained_ = true;  // and every member's reads are done (the barrier)
  return Status::ok();
}

// Note [IPC step protocol], over the windows of `span` bytes: (a)-(d) with interprocess events
// on the device; host-ordered, the op's first step is drained instead.
Status DeviceIpcSteps::run(transport::Comm& comm, DeviceStream& stream, size_t span,
                           const Write& write, const Read& read) {
  if (span == 0) return Status::ok();  // every member has nothing: the same everywhere
  HVD_RETURN_IF_ERROR(reserve(comm, stream, span));
  const bool host_ordered = peers_->hostOrdered();
  const size_t window = peers_->slotBytes();
  for (size_t lo = 0; lo < span; lo += window) {
    const size_t n = std::min(window, span - lo);
    const int slot = static_cast<int>(steps_++ % cuda::kIpcSlots);
    const bool drained = host_ordered && lo == 0;  // the same on every member
    if (!last_drained_) HVD_RETURN_IF_ERROR(peers_->waitPeersReadsDone(slot));  // (a)
    HVD_RETURN_IF_ERROR(write(peers_->slot(comm.rank(), slot), lo, n));         // (b)
    if (drained) {
      HVD_RETURN_IF_ERROR(waitForOwnStream(comm, stream, "this rank's copy into its slot"));
    }
    HVD_RETURN_IF_ERROR(peers_->recordInputReady(slot));
    HVD_RETURN_IF_ERROR(algo::barrier(comm));  // (c)
    if (!drained) HVD_RETURN_IF_ERROR(peers_->waitPeersInputReady(slot));
    HVD_RETURN_IF_ERROR(read(slot, lo, n));  // (d)
    HVD_RETURN_IF_ERROR(peers_->recordReadsDone(slot));
    last_drained_ = drained;
  }
  return Status::ok();
}

// The host-ordered step's wait: the producers finished in phase A, so what is queued is this
// rank's own copies and kernels — and, after a chunked op, its device wait for the peers'
// reads of the slot. Short, but a peer that died there never signals: HVD_TIMEOUT bounds it,
// and abort() ends it at once. reserve() waits the same way. `what`: what it waits for.
Status DeviceIpcSteps::waitForOwnStream(transport::Comm& comm, DeviceStream& stream,
                                        const char* what) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(config_.timeout_seconds));
  transport::Mesh& mesh = comm.mesh();
  if (stream.drain(deadline, std::chrono::microseconds(kIpcStepSpinMicroseconds),
                   [&mesh] { return mesh.aborted(); })) {
    return Status::ok();
  }
  if (mesh.aborted()) return common::aborted("aborted");
  return common::timedOut(std::string("CUDA IPC: ") + what + " did not finish within "
                          "HVD_TIMEOUT=" + std::to_string(config_.timeout_seconds) +
                          " s (the GPU is stuck, a peer died, or the stream failed)");
}

Status DeviceIpcSteps::reduce(const coord::Response& r, DeviceStream& stream, int slot,
                              size_t src_offset, void* dst, size_t bytes, double postscale) {
  if (bytes == 0) return Status::ok();
  const void* srcs[cuda::kMaxReduceSources];
  for (int m = 0; m < peers_->members(); ++m) srcs[m] = peers_->slot(m, slot) + src_offset;
  cuda::ReduceJob job;
  job.dtype = r.dtype;
  job.op = r.reduce_op == common::ReduceOp::kAverage ? common::ReduceOp::kSum : r.reduce_op;
  job.srcs = srcs;
  job.nsrcs = peers_->members();
  job.dst = dst;
  job.count = bytes / common::dataTypeSize(r.dtype);
  job.prescale = r.prescale;
  job.postscale = postscale;
  return cuda::launchReduce(job, stream.stream());
}

Status packWindow(const OpContext& op, DeviceStream& stream, uint8_t* dst, size_t lo,
                  size_t n) {
  const coord::Response& r = op.response;
  const size_t elem = common::dataTypeSize(r.dtype);
  size_t offset = 0;
  for (size_t i = 0; i < r.keys.size(); ++i) {
    const size_t bytes = static_cast<size_t>(r.counts[i]) * elem;
    const auto [start, length] = overlap(offset, bytes, lo, n);
    if (length > 0 && op.entries[i] != nullptr) {
      HVD_RETURN_IF_ERROR(stream.copy(dst + (start - lo),
                                      static_cast<const uint8_t*>(op.entries[i]->input) +
                                          (start - offset),
                                      length));
    } else if (length > 0) {
      HVD_RETURN_IF_ERROR(stream.zero(dst + (start - lo), length));
    }
    offset += bytes;
  }
  return Status::ok();
}

}  // namespace hvd::runtime
