// IpcPeers (ipc_peers.h): export, open, the step protocol's event operations, and close.
#include "transport/cuda/ipc_peers.h"

#include <chrono>
#include <cstring>

#include "common/logging.h"
#include "transport/cuda/device_kernels.h"
#include "transport/nccl/loader.h"

namespace hvd::transport::cuda {

using common::Status;
namespace nccl = transport::nccl;

// Note [IPC step protocol]
//   A collective on the IPC path runs as steps: one when its bytes fit a slot, else one per
//   chunk. Step s uses slot s % 2 of every member's buffer. On every rank r, step s is:
//   (a) the stream waits for every peer's reads_done[slot]: their reads of r's slot in step
//       s-2, the last step that used it. Peer q issued that record (host side) before it
//       reached the host barrier of step s-1, which r passed; q's next record of that event
//       (step s) comes after the barrier of step s, which r has not reached. So the wait
//       captures exactly step s-2's record (CUDA: a wait is for the latest record *at the
//       call*).
//   (b) r writes its input into its slot and records input_ready[slot].
//   (c) a host barrier over the set's CPU Comm (every member issued (b) of step s), then the
//       stream waits for every peer's input_ready[slot] — exactly step s's record, by the same
//       argument (its next record is step s+2's, behind the barrier of step s+1).
//   (d) r reads the members' slots (copies, or the reduce kernel) into its outputs and
//       records reads_done[slot].
//   With one slot, (a) would need the peers' reads of step s-1, whose records are issued
//   after barrier s-1 and may not be issued yet when r reaches step s: r would capture an
//   older record and overwrite a slot a peer still reads. Two slots put a barrier between
//   the issue of each record and the wait on it. Every wait is on the device; the only host
//   round trip is the one barrier per step (none waits for the device), and a later op's
//   writes are ordered after this op's reads by (a).
//
//   Host-ordered first step (HVD_IPC_ORDER=host, the default; the set runs it when any
//   member asks). Phase A (DeviceIpcOps::inputsReady) holds the op, without blocking the
//   loop, until its inputs' producers finished. The op's first step is then drained: after (b)
//   r waits on the host for its own stream — only its own copies and kernels are queued, so
//   the wait is short — and at (c) no stream waits on a peer's input_ready: passing the
//   barrier means every member's write landed. Passing it also means every member's reads of
//   the steps before finished (each waited for its whole stream), so the next step skips (a).
//   The op's later steps (chunks) are device-ordered, so that chunk k+1's copy overlaps chunk
//   k's reduction; every step records both events, which keeps (a) and (c) valid for them.
//   Why: a stream waiting on another process's event seems to cost extra on a GPU that
//   time-slices between processes (no MPS). Measured once on one H100 (benchmarks/RESULTS.md,
//   issue #19), 2 ranks, fully host-ordered vs device-ordered: 4 B 477 vs 598 us per
//   allreduce, 1 MiB 1.69 vs 1.35 GB/s, 64 MiB 75 vs 67 GB/s (within run-to-run noise) — and
//   256 MiB (four chunks) 88 vs 121 GB/s, hence device order for the later chunks.

// Note [IPC teardown]
//   CUDA: "Calling cudaFree on an exported memory region before calling cudaIpcCloseMemHandle
//   in the importing context will result in undefined behavior" — and likewise for an
//   interprocess event. So this rank's exports are freed only once every peer closed its
//   imports, which needs a host barrier between the two: growing the slots (device_ipc_steps.cc)
//   runs stream sync, barrier, closeImported, barrier, freeOwn. The destructor — shutdown,
//   abort, a failed connect (device_path.cc) — has no barrier it can trust (a peer may be dead
//   or may never reach it), so it closes only the imports and keeps (leaks) this rank's buffer
//   and events until the process exits, when the driver releases them after the last importer
//   let go. That is at most one buffer of kIpcSlots * slot_bytes per set and init().
//   Both halves select the stream's device first: the destructor runs on the Python thread
//   (~DeviceExecutor), whose current device may be another GPU.

// Note [IPC sub-allocation]
//   cudaIpcOpenMemHandle maps the whole allocation block that holds the exported pointer and
//   returns the block's base, which need not be that pointer (a caching allocator, or a
//   runtime that sub-allocates, hands out pointers inside larger blocks). So the exporter
//   finds its block's base with the driver's cuMemGetAddressRange and sends `own - base` in
//   its IpcExport; the importer adds it to the mapped base, and closes the base.

IpcPeers::~IpcPeers() {
  closeImported();
  if (own_ != nullptr) {
    HVD_LOG(kDebug, "transport") << "CUDA IPC: this rank's exported buffer stays allocated "
                                 << "until exit (Note [IPC teardown])";
  }
}

const nccl::CudaApi* IpcPeers::api() const { return nccl::cudaApi(); }

void IpcPeers::exportOwn(size_t slot_bytes, IpcExport* out) {
  std::memset(out, 0, sizeof(*out));
  const nccl::CudaApi* cuda = api();
  auto fail = [&](const Status& status) {
    std::strncpy(out->error, status.message().c_str(), sizeof(out->error) - 1);
  };
  if (cuda == nullptr || !cuda->hasIpc()) {
    fail(common::internalError("the CUDA runtime has no IPC entry points"));
    return;
  }
  slot_bytes_ = slot_bytes;
  Status status = stream_.check(cuda->malloc(&own_, kIpcSlots * slot_bytes), "cudaMalloc");
  if (status.isOk()) {
    status = stream_.check(cuda->ipcGetMemHandle(&out->memory, own_), "cudaIpcGetMemHandle");
  }
  const void* base = nullptr;
  if (status.isOk()) status = allocationBase(own_, &base);  // Note [IPC sub-allocation]
  if (status.isOk()) {
    out->offset = static_cast<uint64_t>(static_cast<const uint8_t*>(own_) -
                                        static_cast<const uint8_t*>(base));
  }
  const unsigned flags = nccl::kCudaEventInterprocess | nccl::kCudaEventDisableTiming;
  for (int s = 0; s < kIpcSlots && status.isOk(); ++s) {
    for (auto [event, handle] : {std::pair{&own_input_[s], &out->input_ready[s]},
                                 std::pair{&own_reads_[s], &out->reads_done[s]}}) {
      if (!status.isOk()) break;
      status = stream_.check(cuda->eventCreateWithFlags(event, flags),
                             "cudaEventCreateWithFlags(interprocess)");
      if (status.isOk()) {
        status = stream_.check(cuda->ipcGetEventHandle(handle, *event), "cudaIpcGetEventHandle");
      }
    }
  }
  if (!status.isOk()) {
    fail(status);
    return;
  }
  out->slot_bytes = slot_bytes;
  out->host_ordered = host_ordered_ ? 1 : 0;
  out->ok = 1;
}

Status IpcPeers::openPeers(const std::vector<IpcExport>& all, int me) {
  const nccl::CudaApi* cuda = api();
  me_ = me;
  const int n = static_cast<int>(all.size());
  for (const IpcExport& member : all) host_ordered_ = host_ordered_ || member.host_ordered != 0;
  buffers_.assign(n, nullptr);
  mapped_.assign(n, nullptr);
  for (int s = 0; s < kIpcSlots; ++s) {
    input_[s].assign(n, nullptr);
    reads_[s].assign(n, nullptr);
  }
  buffers_[me] = own_;
  for (int s = 0; s < kIpcSlots; ++s) {
    input_[s][me] = own_input_[s];
    reads_[s][me] = own_reads_[s];
  }
  for (int m = 0; m < n; ++m) {
    if (m == me) continue;
    if (all[m].slot_bytes != slot_bytes_) {
      return common::internalError("member " + std::to_string(m) + " exported " +
                                   std::to_string(all[m].slot_bytes) + "-byte IPC slots, this "
                                   "rank " + std::to_string(slot_bytes_));
    }
    HVD_RETURN_IF_ERROR(stream_.check(
        cuda->ipcOpenMemHandle(&mapped_[m], all[m].memory, nccl::kCudaIpcMemLazyEnablePeerAccess),
        "cudaIpcOpenMemHandle"));
    buffers_[m] = static_cast<uint8_t*>(mapped_[m]) + all[m].offset;
    for (int s = 0; s < kIpcSlots; ++s) {
      HVD_RETURN_IF_ERROR(stream_.check(cuda->ipcOpenEventHandle(&input_[s][m],
                                                                 all[m].input_ready[s]),
                                        "cudaIpcOpenEventHandle"));
      HVD_RETURN_IF_ERROR(stream_.check(cuda->ipcOpenEventHandle(&reads_[s][m],
                                                                 all[m].reads_done[s]),
                                        "cudaIpcOpenEventHandle"));
    }
  }
  return Status::ok();
}

void IpcPeers::closeImported() {
  const nccl::CudaApi* cuda = api();
  if (cuda == nullptr || buffers_.empty()) return;
  nccl::DeviceRestorer restore;
  if (!stream_.select().isOk()) return;
  if (!stream_.drain(std::chrono::steady_clock::now() + std::chrono::seconds(2))) {
    HVD_LOG(kWarning, "transport") << "CUDA IPC: the core's stream still waits (a peer that "
                                   << "died never signals); the peers' mapped buffers stay "
                                   << "open until this process exits";
    return;
  }
  for (int m = 0; m < static_cast<int>(buffers_.size()); ++m) {
    if (m == me_) continue;
    if (mapped_[m] != nullptr) cuda->ipcCloseMemHandle(mapped_[m]);
    for (int s = 0; s < kIpcSlots; ++s) {
      if (input_[s][m] != nullptr) cuda->eventDestroy(input_[s][m]);
      if (reads_[s][m] != nullptr) cuda->eventDestroy(reads_[s][m]);
    }
  }
  for (int s = 0; s < kIpcSlots; ++s) {
    input_[s].clear();
    reads_[s].clear();
  }
  buffers_.clear();
  mapped_.clear();
}

void IpcPeers::freeOwn() {
  const nccl::CudaApi* cuda = api();
  if (cuda == nullptr) return;
  nccl::DeviceRestorer restore;
  if (!stream_.select().isOk()) return;
  for (int s = 0; s < kIpcSlots; ++s) {
    if (own_input_[s] != nullptr) cuda->eventDestroy(own_input_[s]);
    if (own_reads_[s] != nullptr) cuda->eventDestroy(own_reads_[s]);
    own_input_[s] = own_reads_[s] = nullptr;
  }
  if (own_ != nullptr) cuda->free(own_);
  own_ = nullptr;
}

Status IpcPeers::waitAll(const std::vector<nccl::CudaEvent>* events, int slot) {
  for (int m = 0; m < members(); ++m) {
    if (m != me_) HVD_RETURN_IF_ERROR(stream_.waitFor(events[slot][m]));
  }
  return Status::ok();
}

Status IpcPeers::waitPeersReadsDone(int slot) { return waitAll(reads_, slot); }
Status IpcPeers::waitPeersInputReady(int slot) { return waitAll(input_, slot); }

Status IpcPeers::recordInputReady(int slot) {
  return stream_.check(api()->eventRecord(own_input_[slot], stream_.stream()), "cudaEventRecord");
}

Status IpcPeers::recordReadsDone(int slot) {
  return stream_.check(api()->eventRecord(own_reads_[slot], stream_.stream()), "cudaEventRecord");
}

}  // namespace hvd::transport::cuda
