// Metrics: cheap counters the background thread bumps and any thread reads (relaxed atomics),
// plus a small mutex-guarded description of what the loop is doing right now (the collective
// it is executing, the names it is waiting on). Read by the Python publisher a few times a
// second; never on the hot path beyond a few relaxed increments.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace hvd::runtime {

constexpr int kNumOpKinds = 7;  // coord::OpType values

struct PendingInfo {
  std::string name;
  std::string op;
  double age_seconds = 0;
  std::vector<int> missing_ranks;  // known on rank 0 only; empty elsewhere
};

struct MetricsSnapshot {
  std::array<uint64_t, kNumOpKinds> ops{};
  std::array<uint64_t, kNumOpKinds> bytes{};
  uint64_t fused_batches = 0;
  uint64_t fused_tensors = 0;
  double negotiate_seconds = 0;
  double communicate_seconds = 0;
  double wait_seconds = 0;         // the loop idle, waiting for work (also idle_seconds)
  double handle_wait_seconds = 0;  // framework threads blocked in wait()
  // How long the main thread has been blocked in its current wait(), 0 when it is not
  // blocked: Note [Blocked main thread].
  double main_blocked_seconds = 0;
  uint64_t caller_driven_ops = 0;  // waits whose op finished on the waiting thread
  // waits whose CUDA op the waiting thread saw finish on the device (Note [Caller waits on
  // the device] in device_executor.cc)
  uint64_t caller_polled_ops = 0;
  int64_t caller_spin_us = 0;      // HVD_CALLER_SPIN_US in force (0 where callers never drive)
  bool spin_yields = false;        // Note [Yielding spins]
  uint64_t caller_spin_extended = 0;  // driven waits that spun past their budget (core free)
  uint64_t one_round_ops = 0;  // ops agreed and moved in one board round (runtime/one_round.cc)
  uint64_t caller_spin_skipped = 0;  // driven waits that did not spin (Note [Spin backoff])
  uint64_t caller_passes = 0;      // loop passes run by driving callers (their spin's polls)
  uint64_t loop_wakeups = 0;       // the loop thread's waits that ended, for any reason
  uint64_t tick_pickups = 0;       // Note [Tick pickups] in background_loop.cc
  // Point-to-point messages this rank sent / received (runtime/peer_ops.h) and their bytes.
  uint64_t p2p_sent = 0, p2p_sent_bytes = 0, p2p_received = 0, p2p_received_bytes = 0;
  // Note [Split copy]: messages sent and received half by each side, offers refused.
  uint64_t p2p_split_sent = 0, p2p_split_received = 0, p2p_split_refused = 0;
  uint64_t queue_depth = 0;
  std::string last_error;
  std::string current_op;          // "" when idle
  std::string current_name;
  double current_seconds = 0;
  std::vector<PendingInfo> pending;
  std::vector<int> shutting_down;       // rank 0: the ranks that told it they shut down
  std::vector<std::string> transports;  // per global rank: "self" / "shm" / "tcp"
  // per global rank: how negotiation frames travel to it, "shm" / "tcp" / "none" (no channel)
  std::vector<std::string> control_transports;
  // How host collectives move bytes between this host's ranks: "single-copy" (peers' inputs
  // read with process_vm_readv), "single-copy broadcast" (broadcasts only: HVD_SINGLE_COPY=auto),
  // "segment" (through the shared segment) or "none" (no host segment); host_copy_reason says
  // what keeps it from reading every op directly ("" when nothing does).
  std::string cpu_binding;  // CPUs this rank is bound to ("2,3"); "" unbound (Note [CPU binding])
  std::string host_copy;
  std::string host_copy_reason;
  // Note [Shared outputs] in algo/shared_outputs.cc: whether this host's alltoalls and
  // allgathers write into the ranks' outputs directly, why not ("" when they do), and how
  // many did since the process started.
  bool shared_outputs = false;
  std::string shared_outputs_reason;
  uint64_t shared_output_ops = 0;
  uint64_t shared_output_fallbacks = 0;  // ops that took the slots: some output not shared
  uint64_t peer_block_maps = 0;  // peers' blocks this process mapped (Note [Peer block cache])
  uint64_t single_copy_ops = 0;  // host ops that read peers directly, since the process started
  uint64_t host_chunks = 0;  // chunks through host collective segments (algo/segment_walk.h)
  uint64_t helper_reads = 0;  // reads run by the process's reading thread (helper_read.h)
  uint64_t single_copy_probes = 0;  // Note [Single-copy probe]s run, since the process started
  struct DevicePath {
    int32_t process_set = 0;
    std::string path;  // "nccl" / "staged"
    int device = -1;   // this rank's CUDA ordinal for the set
  };
  std::vector<DevicePath> device_paths;  // sets that ran CUDA collectives, in first-use order
};

class Metrics {
 public:
  void countOp(int kind, uint64_t bytes, size_t tensors);
  void addNegotiate(double s) { add(negotiate_us_, s); }
  void addCommunicate(double s) { add(communicate_us_, s); }
  void addWait(double s) { add(wait_us_, s); }  // the loop's idle poll
  void addHandleWait(double s) {  // nanoseconds: most waits on a fast path are sub-microsecond
    handle_wait_ns_.fetch_add(static_cast<uint64_t>(s * 1e9), std::memory_order_relaxed);
  }
  // Note [Blocked main thread]: the binding marks the main thread's slow-path wait()
  // (the thread a %%hvd cell runs on, the only one SIGINT reaches). The notebook driver ends
  // a cell that can never finish only when every rank still running it is blocked here: a
  // rank with collectives merely pending (async ops, gradient hooks) may still be computing.
  void setMainBlocked(bool blocked) {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
    main_blocked_since_ns_.store(blocked ? now : 0, std::memory_order_relaxed);
  }
  void countDriven() { driven_.fetch_add(1, std::memory_order_relaxed); }
  void countSpinExtended() { spin_extended_.fetch_add(1, std::memory_order_relaxed); }
  void countOneRound() { one_round_ops_.fetch_add(1, std::memory_order_relaxed); }
  void countCallerPolled() { polled_.fetch_add(1, std::memory_order_relaxed); }
  void countSpinSkipped() { spin_skipped_.fetch_add(1, std::memory_order_relaxed); }
  void countCallerPasses(int n) { caller_passes_.fetch_add(n, std::memory_order_relaxed); }
  void countLoopWakeup() { loop_wakeups_.fetch_add(1, std::memory_order_relaxed); }
  void countTickPickup() { tick_pickups_.fetch_add(1, std::memory_order_relaxed); }
  void countP2p(bool sent, uint64_t bytes) {
    (sent ? p2p_sent_ : p2p_received_).fetch_add(1, std::memory_order_relaxed);
    (sent ? p2p_sent_bytes_ : p2p_received_bytes_).fetch_add(bytes, std::memory_order_relaxed);
  }
  void countP2pSplit(uint64_t sent, uint64_t received, uint64_t refused) {
    if (sent != 0) p2p_split_sent_.fetch_add(sent, std::memory_order_relaxed);
    if (received != 0) p2p_split_received_.fetch_add(received, std::memory_order_relaxed);
    if (refused != 0) p2p_split_refused_.fetch_add(refused, std::memory_order_relaxed);
  }
  void setCallerSpin(int64_t us) { caller_spin_us_.store(us, std::memory_order_relaxed); }
  void setSpinYields(bool on) { spin_yields_.store(on, std::memory_order_relaxed); }
  void setQueueDepth(uint64_t n) { queue_depth_.store(n, std::memory_order_relaxed); }
  void setLastError(const std::string& text);
  void beginOp(const std::string& op, const std::string& name);
  void endOp();
  void setPending(std::vector<PendingInfo> pending);
  void setShuttingDown(std::vector<int> ranks);
  void setTransports(std::vector<std::string> transports,
                     std::vector<std::string> control_transports);
  void setHostCopy(std::string mode, std::string reason);
  void setCpuBinding(std::string cpus);
  void setSharedOutputs(bool on, std::string reason);
  void setDevicePath(int32_t process_set, const std::string& path, int device);
  MetricsSnapshot snapshot() const;
  void reset();

 private:
  static void add(std::atomic<uint64_t>& us, double s) {
    us.fetch_add(static_cast<uint64_t>(s * 1e6), std::memory_order_relaxed);
  }
  std::array<std::atomic<uint64_t>, kNumOpKinds> ops_{};
  std::array<std::atomic<uint64_t>, kNumOpKinds> bytes_{};
  std::atomic<uint64_t> fused_batches_{0}, fused_tensors_{0};
  std::atomic<uint64_t> negotiate_us_{0}, communicate_us_{0}, wait_us_{0}, handle_wait_ns_{0};
  std::atomic<uint64_t> queue_depth_{0};
  std::atomic<uint64_t> driven_{0};
  std::atomic<uint64_t> polled_{0};  // countCallerPolled
  std::atomic<uint64_t> spin_extended_{0};  // countSpinExtended
  std::atomic<uint64_t> one_round_ops_{0};  // countOneRound
  std::atomic<uint64_t> spin_skipped_{0};
  std::atomic<uint64_t> caller_passes_{0}, loop_wakeups_{0}, tick_pickups_{0};
  std::atomic<uint64_t> p2p_sent_{0}, p2p_sent_bytes_{0}, p2p_received_{0},
      p2p_received_bytes_{0};
  std::atomic<uint64_t> p2p_split_sent_{0}, p2p_split_received_{0}, p2p_split_refused_{0};
  std::atomic<int64_t> caller_spin_us_{0};
  std::atomic<bool> spin_yields_{false};
  std::atomic<int64_t> main_blocked_since_ns_{0};  // steady clock; 0: not blocked; not reset
  mutable std::mutex mutex_;
  std::string last_error_, current_op_, current_name_;
  std::chrono::steady_clock::time_point current_since_;
  std::vector<PendingInfo> pending_;
  std::vector<int> shutting_down_;
  std::vector<std::string> transports_;
  std::vector<std::string> control_transports_;
  std::string cpu_binding_;
  std::string host_copy_;
  std::string host_copy_reason_;
  bool shared_outputs_ = false;
  std::string shared_outputs_reason_;
  std::vector<MetricsSnapshot::DevicePath> device_paths_;
};

}  // namespace hvd::runtime
