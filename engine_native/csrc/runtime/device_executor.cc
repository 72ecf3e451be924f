// DeviceExecutor (device_executor.h): sets, streams, dispatch to the path strategies
// (device_ops.h), deferred completion and abort. The path choice is in device_path.cc.
#include "runtime/device_executor.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <thread>

#include "common/logging.h"
#include "common/test_switch.h"
#include "runtime/device_ipc_ops.h"
#include "runtime/device_mixed_ops.h"
#include "runtime/device_nccl_ops.h"
#include "runtime/device_path.h"
#include "runtime/device_solo_ops.h"

namespace hvd::runtime {

namespace nccl = transport::nccl;
using common::Status;
using Clock = std::chrono::steady_clock;

// Note [Deferred completion]: an op's stream work (waits on the producers' events, copies,
// the NCCL call) is only queued when its method returns; queueCompletion() records an event
// after it and queues a host function that writes the loop's eventfd once the stream reaches
// it (LoopWake). The loop, woken, calls poll(): events that fired complete their handles, in
// queue order. No thread blocks on the device on this path (the staged path waits for its own
// copies, Note [Staged fallback]; the host-ordered IPC path for its own step, Note [IPC step
// protocol]). An op whose own caller waits for it is the exception below.
//
// Note [Caller waits on the device]
// A host function per op costs a driver-thread callback, an eventfd write and a loop-thread
// wake-up, all to tell a framework thread that is already blocked on the op. Where that thread
// is the one that queued the op's stream work, it waits on the op's event itself:
//   A. A caller that drives its op (Note [Caller drives] in background_loop.cc; only ops
//      enqueued for an at-once wait, E there) names its handle to the Executor for its passes.
//      A completion holding that handle is queued with caller_polls set and no host function;
//      every other completion (async ops, ops the loop thread executes, a caller's drive that
//      ran someone else's op) keeps the host function, so the loop thread never blocks on the
//      device and a waiter that comes after the host function was queued just blocks on its
//      handle, as before.
//   B. The caller's drive ends as soon as its op is queued so (it counts as driven, and as a
//      spin that paid: Note [Spin backoff] must not turn spins off because the device, not a
//      peer, is what the caller waits for); then, while its handle is in a caller_polls
//      completion in flight, it polls the events from awaitDevice() in slices of the
//      binding's 50 ms wait (so Ctrl-C is seen between slices): under
//      progress_, pollDevice() completes the ops whose events fired, each stream's in queue
//      order (one stream per device: the ops queued before it, async or not, finished first
//      and complete with it; one behind an op seen unfinished waits for the next poll);
//      until HVD_CALLER_SPIN_US has passed since the wait began (none while the
//      drive's spins are backed off: Note [Spin backoff]) it polls without sleeping (a short
//      pause between polls, which leaves progress_ free; a yield where the host's ranks
//      outnumber its cores, as the drive does), then it sleeps between polls
//      (common/poll_pacer.h: an eighth of the time waited, 20 us to 1 ms), so it is never
//      more than ~1/8 late and costs at most ~1000
//      short wake-ups a second on a long op — engines outnumber cores, so no long busy spin.
//      The spin is for small ops: on the H200 (gVisor) a 4 B CUDA IPC allreduce under MPS took
//      165-171 us with the naps from the first poll (a sleep there costs far more than 20 us).
//   C. Not cudaEventSynchronize (even on a blocking-sync event): it cannot be bounded or
//      interrupted. A collective whose input comes from a kernel that never finishes, an IPC
//      step whose peer died, or an op behind them would hold the caller past HVD_TIMEOUT and
//      past abort(), which must end every wait; ncclCommAbort frees NCCL's kernels only.
//   D. Failures end the wait as they end everything else: the caller's pollDevice() runs the
//      HVD_TIMEOUT and NCCL error checks (it fails the core itself); abort() and a lost peer
//      reach the loop thread (the drive, ending with its op unfinished, woke it, and it stays
//      out of standby while device work is in flight: idle(), Note [Caller drives] C),
//      whose fail() completes every op in flight with the error (abort(): a bounded drain,
//      then the handles), which the caller sees at its next poll.
//   E. A caller that stops polling (a signal between slices) leaves its op to the loop
//      thread's idle tick (200 ms; every pass polls the device): late, never lost.
//   F. Point-to-point too: PeerOps gets the same awaited handle for the drive, and the CUDA
//      copy queued for it (a blocking send's staging copy, a blocking receive's read onto the
//      device) asks for no wake (Note [Device point-to-point] H in device_peer_ops.cc); the
//      drive ends once it is queued, and awaitDevice() polls PeerOps' copies after the
//      Executor's, under the same rules (B-E; the spin budget is point-to-point's own record,
//      Note [Caller drives] H).
// The fake CUDA runtime counts the host functions (tests/multiproc/test_device_completion.py,
// test_device_p2p.py); only a device run shows the latency against the host function's.

namespace {

const char* pathName(const PathChoice& choice) {
  return choice.nccl ? "nccl" : choice.ipc ? "cuda-ipc" : choice.mixed ? "cuda-ipc+nccl"
                                                                      : "staged";
}

// Issue #39 item 6: a path never run on real hardware warns once per process when first used;
// remove its warning once a device run proves it. Left: the mixed set (several GPUs, some
// shared), which a one-GPU machine cannot run. Proven on an H200 (2026-12-04) and no longer
// warned: the one-rank local path, caller-polled completions, CUDA point-to-point (IPC and
// staged), sparse gradients on CUDA.
void warnUnverified(std::atomic<bool>& warned, const char* what) {
  if (warned.exchange(true)) return;
  HVD_LOG(kWarning, "transport") << what << " has not yet been verified on a GPU (tested only "
                                 << "against a fake CUDA runtime)";
}

std::atomic<bool> g_mixed_warned{false};

// Test switch: HVD_TEST_DEVICE_POLL_GAP_MS=N: a poll that found an op unfinished waits N ms
// before its next query, as a thread descheduled between two queries while the stream ran on.
void pauseBetweenQueriesForTests() {
  if (const char* raw = HVD_TEST_SWITCH("DEVICE_POLL_GAP_MS")) {
    std::this_thread::sleep_for(std::chrono::milliseconds(std::atoi(raw)));
  }
}

}  // namespace

DeviceExecutor::DeviceExecutor(Metrics& metrics, const common::Config& config, int wake_fd)
    : metrics_(metrics),
      config_(config),
      wake_(wake_fd),
      held_(wake_),
      staged_(metrics, config, held_) {}

DeviceExecutor::~DeviceExecutor() {
  if (busy()) {
    std::vector<DeviceCompletion> dropped;
    abort(&dropped, /*core_failed=*/true);  // the loop completed their handles already
  }
  sets_.clear();     // communicators first: they queue on the streams
  streams_.clear();  // each drains, then frees its buffers and events
}

int DeviceExecutor::localDevice(const OpContext& op) const {
  for (const TensorEntry* e : op.entries) {
    if (e != nullptr) return e->request.device;
  }
  // This rank joined: its zeros live on the set's GPU, else where join(device=...) said.
  auto it = sets_.find(op.response.process_set);
  if (it != sets_.end()) return it->second.device;
  return join_device_;
}

Status DeviceExecutor::prepare(OpContext& op) {
  const int device = localDevice(op);
  if (device < 0) {
    return common::invalidArgument(
        "rank " + std::to_string(op.comm.globalRank(op.comm.rank())) + " joined with "
        "join(device=-1) before running a CUDA op, and the other ranks reduce CUDA tensors: "
        "its zeros need a GPU; call join(device=<cuda ordinal>) there");
  }
  for (const TensorEntry* e : op.entries) {  // a fused batch: every tensor on that GPU
    if (e != nullptr && e->request.device != device) {
      return common::internalError("a batch of CUDA tensors spans cuda:" +
                                   std::to_string(device) + " and cuda:" +
                                   std::to_string(e->request.device) +
                                   "; keep each rank's tensors on one GPU");
    }
  }
  auto& slot = streams_[device];
  if (!slot) {
    slot = std::make_unique<nccl::DeviceStream>();
    Status status = slot->init(device);
    if (!status.isOk()) {
      streams_.erase(device);
      return status;
    }
  }
  current_.stream = slot.get();
  HVD_RETURN_IF_ERROR(current_.stream->select());
  auto it = sets_.find(op.response.process_set);
  if (it == sets_.end()) {
    HVD_RETURN_IF_ERROR(setUp(op, device));
    it = sets_.find(op.response.process_set);
  } else if (it->second.device != device) {
    return common::internalError(
        "process set " + std::to_string(op.response.process_set) + ": this rank's CUDA "
        "tensors of one process set must stay on one GPU (cuda:" +
        std::to_string(it->second.device) + " first, cuda:" + std::to_string(device) +
        " now); move them to one device");
  }
  current_.set = &it->second;
  return waitForInputs(op);
}

Status DeviceExecutor::setUp(OpContext& op, int device) {
  const int32_t id = op.response.process_set;
  // Note [A world of one]; HVD_GPU_PATH=nccl still asks for a (one-rank) communicator.
  if (op.comm.size() == 1 && config_.gpu_path != "staged" && config_.gpu_path != "nccl") {
    HVD_LOG(kInfo, "transport") << "process set " << id << " has one rank: its CUDA "
                                << "collectives are device copies on cuda:" << device;
    metrics_.setDevicePath(id, "local", device);
    DeviceSet set;
    set.device = device;
    set.ops = std::make_unique<DeviceSoloOps>(metrics_);
    sets_.emplace(id, std::move(set));
    return Status::ok();
  }
  PathChoice choice;
  PathWish wish;
  wish.wanted = config_.gpu_path;
  wish.ipc_host_ordered = config_.ipc_order == "host";
  wish.nccl_multi_rank_gpu = config_.nccl_multi_rank_gpu;
  HVD_RETURN_IF_ERROR(choosePath(op.comm, *current_.stream, wish, &choice));
  if (choice.nccl) {
    HVD_LOG(kInfo, "transport") << "process set " << id << ": CUDA collectives via NCCL on cuda:"
                                << device;
  } else if (choice.mixed) {
    HVD_LOG(kInfo, "transport") << "process set " << id << ": CUDA allreduce via CUDA IPC among "
                                << "the " << choice.gpu_comm->size() << " ranks on cuda:" << device
                                << ", then NCCL among one rank per GPU; other CUDA collectives "
                                << "stage through host memory";
    warnUnverified(g_mixed_warned, "a mixed process set (CUDA IPC within each GPU, NCCL between "
                                   "GPUs)");
  } else if (choice.ipc) {
    HVD_LOG(kInfo, "transport") << "process set " << id << ": CUDA collectives via CUDA IPC "
                                << "between the " << op.comm.size() << " ranks sharing cuda:"
                                << device << ", reductions on the device";
  } else {
    HVD_LOG(kWarning, "transport") << "process set " << id << ": CUDA collectives take the "
                                   << "staged path through host memory (slower): "
                                   << choice.why;
  }
  metrics_.setDevicePath(id, pathName(choice), device);
  DeviceSet set;
  set.device = device;
  if (choice.nccl) {
    set.ops = std::make_unique<DeviceNcclOps>(metrics_, std::move(choice.communicator));
  } else if (choice.ipc) {
    set.ops = std::make_unique<DeviceIpcOps>(metrics_, config_, held_, std::move(choice.peers));
  } else if (choice.mixed) {
    set.ops = std::make_unique<DeviceMixedOps>(metrics_, config_, std::move(choice.gpu_comm),
                                               std::move(choice.peers),
                                               std::move(choice.communicator));
  }
  sets_.emplace(id, std::move(set));
  return Status::ok();
}

// Note [Stream ordering] in transport/nccl/device_stream.h: each input's producer event was
// recorded at enqueue; the stream waits for them here, on the device.
Status DeviceExecutor::waitForInputs(const OpContext& op) {
  for (TensorEntry* e : op.entries) {
    if (e == nullptr || e->ready.get() == nullptr) continue;
    HVD_RETURN_IF_ERROR(stream().waitFor(e->ready.get()));
    e->ready.reset();
  }
  return Status::ok();
}

DeviceOps& DeviceExecutor::opsFor(const OpContext& op) {
  DeviceOps* ops = current_.set->ops.get();
  return ops != nullptr && !ops->stagesThroughHost(op) ? *ops : staged_;
}

Status DeviceExecutor::allreduce(OpContext& op) { return opsFor(op).allreduce(op, stream()); }
Status DeviceExecutor::allgather(OpContext& op) { return opsFor(op).allgather(op, stream()); }
Status DeviceExecutor::broadcast(OpContext& op) { return opsFor(op).broadcast(op, stream()); }
Status DeviceExecutor::alltoall(OpContext& op) { return opsFor(op).alltoall(op, stream()); }
Status DeviceExecutor::reducescatter(OpContext& op) {
  return opsFor(op).reducescatter(op, stream());
}

Status DeviceExecutor::inputsReady(OpContext& op, bool* ready) {
  return opsFor(op).inputsReady(op, stream(), ready);
}

Status DeviceExecutor::queueCompletion(DeviceCompletion completion) {
  InFlight item;
  item.stream = current_.stream;
  HVD_RETURN_IF_ERROR(item.stream->record(&item.done));
  // Note [Caller waits on the device] A: its waiting caller polls the event instead.
  Status status = completion.caller_polls ? Status::ok() : wake_.notifyAfter(*item.stream);
  if (!status.isOk()) {
    item.stream->release(item.done);
    return status;
  }
  if (in_flight_.empty()) progress_at_ = Clock::now();
  item.completion = std::move(completion);
  in_flight_.push_back(std::move(item));
  return Status::ok();
}

bool DeviceExecutor::callerPolls(int64_t handle) const {
  for (const InFlight& item : in_flight_) {
    if (!item.completion.caller_polls) continue;
    const auto& handles = item.completion.handles;
    if (std::find(handles.begin(), handles.end(), handle) != handles.end()) return true;
  }
  return false;
}

bool DeviceExecutor::dropProcessSet(int32_t id) {
  auto it = sets_.find(id);
  if (it == sets_.end()) return true;
  if (busy()) return false;  // its communicator may still have work queued
  sets_.erase(it);
  return true;
}

Status DeviceExecutor::poll(std::vector<DeviceCompletion>* done) {
  const auto now = Clock::now();
  if (held_.overdue(now, config_.timeout_seconds)) {
    return common::timedOut("a CUDA op waited for its inputs' producers (or their copy to "
                            "host memory) for HVD_TIMEOUT=" +
                            std::to_string(config_.timeout_seconds) +
                            " s: a kernel that produces them never finishes");
  }
  if (in_flight_.empty()) return Status::ok();
  // Queue order (Note [Caller waits on the device] B): a stream's events fire in order, but
  // one found unfinished may fire, and the ops behind it too, before the next query; those
  // wait for the next poll, or a caller's op would complete before the ones queued earlier.
  pending_streams_.clear();
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (std::find(pending_streams_.begin(), pending_streams_.end(), it->stream) !=
        pending_streams_.end()) {
      ++it;
      continue;
    }
    if (!pending_streams_.empty()) pauseBetweenQueriesForTests();
    bool finished = false;
    HVD_RETURN_IF_ERROR(it->stream->query(it->done, &finished));
    if (!finished) {
      pending_streams_.push_back(it->stream);
      ++it;
      continue;
    }
    it->stream->release(it->done);
    done->push_back(std::move(it->completion));
    it = in_flight_.erase(it);
    progress_at_ = now;
  }
  if (in_flight_.empty()) {
    for (auto& [device, stream] : streams_) stream->freeRetired();  // nothing queued uses them
    return Status::ok();
  }
  return checkTimeout(now);
}

// A collective that waits on a peer forever shows as an event that never fires; NCCL may
// know why (ncclCommGetAsyncError).
Status DeviceExecutor::checkTimeout(Clock::time_point now) {
  for (auto& [id, set] : sets_) {
    if (set.ops) HVD_RETURN_IF_ERROR(set.ops->asyncError());
  }
  const double waited = std::chrono::duration<double>(now - progress_at_).count();
  if (waited < config_.timeout_seconds) return Status::ok();
  return common::timedOut("a CUDA collective made no progress for " +
                         std::to_string(static_cast<int>(waited)) + " s (HVD_TIMEOUT=" +
                         std::to_string(config_.timeout_seconds) + "): a peer stopped taking "
                         "part, or a kernel it waits for never finishes");
}

void DeviceExecutor::abort(std::vector<DeviceCompletion>* all, bool core_failed) {
  if (!core_failed && !busy()) return;
  for (auto& [id, set] : sets_) {
    if (set.ops) set.ops->abort();
  }
  // Users' tensors may still be written by queued copies: give the streams a short, bounded
  // time to drain before the handles complete (an aborted collective returns at once; work
  // behind a producer that never finishes will not drain, and every rank must fail within
  // HVD_TIMEOUT).
  const auto give_up = Clock::now() + std::chrono::milliseconds(
      static_cast<int64_t>(std::min(1.0, config_.timeout_seconds / 4) * 1000));
  held_.release();  // its copies only read users' tensors: no need to wait for them
  for (InFlight& item : in_flight_) {
    bool finished = false;
    while (item.stream->query(item.done, &finished).isOk() && !finished &&
           Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (!finished) {
      HVD_LOG(kWarning, "transport") << "a CUDA collective still runs after abort; its "
                                     << "handles complete anyway";
    }
    item.stream->release(item.done);
    all->push_back(std::move(item.completion));
  }
  in_flight_.clear();
}

}  // namespace hvd::runtime
