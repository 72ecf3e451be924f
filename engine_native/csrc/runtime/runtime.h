// Runtime: the process-wide core the binding talks to — lifecycle (listen, init, shutdown,
// abort), local validation of enqueued ops (errors raised on the calling rank only), the
// handle table, process sets and metrics. Framework threads call it; it hands entries to the
// BackgroundLoop. One instance per process; init() after shutdown() builds a fresh mesh/loop.
// It also owns, per init, the Timeline (HVD_TIMELINE at init, start/stop at run time; the file
// is written on rank 0 only, the in-memory strip on every rank) and the Autotuner; the loop
// records into them and both are torn down only after the loop has stopped.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "algo/host_chunks.h"
#include "algo/shared_outputs.h"
#include "algo/single_copy.h"
#include "common/config.h"
#include "common/status.h"
#include "coord/message.h"
#include "runtime/autotuner.h"
#include "runtime/background_loop.h"
#include "runtime/handle_table.h"
#include "runtime/metrics.h"
#include "runtime/process_sets.h"
#include "transport/mesh.h"
#include "transport/shm/cross_memory.h"
#include "transport/shm/helper_read.h"
#include "transport/shm/shared_blocks.h"

namespace hvd::runtime {

struct EnqueueArgs {
  coord::Request request;   // request_rank filled by the runtime; name left empty
  std::string_view name;    // the tensor name, valid for the duration of the enqueue call
  const void* input = nullptr;
  // Where the result goes. An allgather's, alltoall's or reducescatter's may be null (the core
  // allocates it) or a guess of output_bytes the one-round board fills when the result is exactly that
  // size (Note [Output guesses] in one_round_ops.cc); the op's result then has no buffer.
  void* output = nullptr;
  size_t output_bytes = 0;
  // CUDA tensors (request.device >= 0): the stream that produced them (cudaStream_t; 0 is the
  // legacy default stream). The op waits for what was queued there before the enqueue.
  uintptr_t stream = 0;
};

class Runtime {
 public:
  static Runtime& instance();
  // Joins the loop thread even when a caller still holds the loop (drive()), before the mesh
  // and the handle table it uses are destroyed.
  ~Runtime();

  common::Status listen(const std::string& bind_address, int* port);
  common::Status init(int rank, const std::vector<transport::PeerInfo>& peers,
                      const std::string& secret, const std::string& job_id);
  void shutdown();
  void abort(const std::string& reason);
  // The sticky failure (lost peer, timeout, abort) that every later op fails with until
  // shutdown(); ok when there is none or the core is not initialized.
  common::Status failure() const;
  bool initialized() const;
  int rank() const;
  int size() const;

  // Validates every op (ValueError/TypeError-coded Status on this rank only), then submits
  // them together so a group is negotiated in one batch. wake=false: the caller waits for
  // them next, and that wait drives them (BackgroundLoop::drive).
  common::Status enqueue(std::vector<EnqueueArgs> ops, std::vector<int64_t>* handles,
                         bool wake = true);
  // The same for one op (the per-tensor path of every framework).
  common::Status enqueue(EnqueueArgs&& op, int64_t* handle, bool wake = true);
  // Before blocking on `handle`: run the core's passes on this thread for a bounded time.
  // True when the handle finished here. Call without the GIL.
  bool drive(int64_t handle);
  // After drive(): BackgroundLoop::awaitDevice (Note [Caller waits on the device]).
  bool awaitDevice(int64_t handle, int slice_ms, std::chrono::steady_clock::time_point since);
  // After drive(): BackgroundLoop::awaitPeer (Note [Caller sleeps on the doorbell]).
  bool awaitPeer(int64_t handle, int slice_ms);
  HandleTable& handles() { return handles_; }

  // Point-to-point (Note [Point-to-point] in peer_ops.cc), between global ranks. `data` must
  // stay valid until the handle completes; a receive's handle completes with the message
  // (OpResult: buffer, shape, dtype). wait_now: the caller blocks on the handle at once and
  // drives it (Note [Point-to-point] E).
  common::Status send(PeerSend send, bool wait_now, int64_t* handle);
  common::Status recv(const PeerRecv& recv, bool wait_now, int64_t* handle);
  // PeerOps::cudaRoute: "ipc", "staged", or "" (no channel to `peer`).
  std::string peerCudaRoute(int peer) const;
  common::Status addProcessSet(std::vector<int> ranks, int32_t* id);
  common::Status removeProcessSet(int32_t id);
  std::optional<std::vector<int>> processSetRanks(int32_t id) const;
  MetricsSnapshot metrics() const {
    MetricsSnapshot s = metrics_.snapshot();
    s.single_copy_ops = algo::singleCopyOps();
    s.host_chunks = algo::hostChunks();
    s.helper_reads = transport::shm::helperReads();
    s.shared_output_ops = algo::sharedOutputOps();
    s.shared_output_fallbacks = algo::sharedOutputFallbacks();
    s.peer_block_maps = transport::shm::peerBlockMaps();
    s.single_copy_probes = transport::shm::singleCopyProbes();
    return s;
  }
  const common::Config& config() const { return config_; }
  // Framework threads report time spent blocked in wait() (the binding measures it).
  void addHandleWait(double seconds) { metrics_.addHandleWait(seconds); }
  // The main thread entering / leaving a blocking wait(): Note [Blocked main thread].
  void setMainBlocked(bool blocked) { metrics_.setMainBlocked(blocked); }

  // Timeline control (any thread; block until the writer applied it). On ranks other than 0
  // start/stop succeed and write nothing (Horovod writes the timeline on rank 0 only).
  common::Status startTimeline(const std::string& path, bool mark_cycles);
  common::Status stopTimeline();
  // Counters and file state of this rank's timeline (empty stats before init).
  timeline::TimelineStats timelineStats() const;
  // Finished spans and ticks of the last seconds (see timeline::Timeline::recentEvents).
  std::vector<timeline::RecentEvent> timelineEvents(int64_t since_us) const;

  // Autotune state of this rank (nullopt before the first init) and its switch.
  std::optional<AutotuneReport> autotuneReport() const;
  common::Status setAutotune(bool enabled);
  common::Status setTunedParams(const autotune::TunedParams& params);

 private:
  common::Status validate(coord::Request* request, std::string_view name) const;
  common::Status checkNotCapturing(const TensorEntry& entry, std::string_view name) const;
  common::Status recordReady(TensorEntry* entry) const;
  common::Status checkDevice(coord::Request* request, std::string_view name);
  // Validates and submits; entries' handles are created by BackgroundLoop::submit.
  common::Status submitLocked(TensorEntry* entries, const std::string_view* names, size_t count,
                              bool wake);
  void startTimelineAtInit();

  mutable std::mutex mutex_;  // lifecycle vs enqueue
  std::unique_ptr<transport::Mesh> mesh_;
  std::shared_ptr<timeline::Timeline> timeline_;  // shared: control calls run unlocked
  std::shared_ptr<Autotuner> autotuner_;          // kept after shutdown: state stays readable
  std::shared_ptr<BackgroundLoop> loop_;  // shared: a driving caller keeps it alive
  std::shared_ptr<BackgroundLoop> liveLoop();  // loop_, read under mutex_
  common::Config config_;
  ProcessSetTable sets_;
  std::map<int32_t, int> set_devices_;  // this rank's GPU per process set (guarded by mutex_)
  HandleTable handles_;
  Metrics metrics_;
  int rank_ = -1;
  int size_ = 0;
};

}  // namespace hvd::runtime
