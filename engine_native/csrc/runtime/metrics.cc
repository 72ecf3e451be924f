#include "runtime/metrics.h"

namespace hvd::runtime {

void Metrics::countOp(int kind, uint64_t bytes, size_t tensors) {
  if (kind < 0 || kind >= kNumOpKinds) return;
  ops_[kind].fetch_add(tensors, std::memory_order_relaxed);
  bytes_[kind].fetch_add(bytes, std::memory_order_relaxed);
  if (tensors > 1) {
    fused_batches_.fetch_add(1, std::memory_order_relaxed);
    fused_tensors_.fetch_add(tensors, std::memory_order_relaxed);
  }
}

void Metrics::setLastError(const std::string& text) {
  std::lock_guard<std::mutex> lock(mutex_);
  last_error_ = text;
}

void Metrics::beginOp(const std::string& op, const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  current_op_ = op;
  current_name_ = name;
  current_since_ = std::chrono::steady_clock::now();
}

void Metrics::endOp() {
  std::lock_guard<std::mutex> lock(mutex_);
  current_op_.clear();
  current_name_.clear();
}

void Metrics::setPending(std::vector<PendingInfo> pending) {
  std::lock_guard<std::mutex> lock(mutex_);
  pending_ = std::move(pending);
}

void Metrics::setShuttingDown(std::vector<int> ranks) {
  std::lock_guard<std::mutex> lock(mutex_);
  shutting_down_ = std::move(ranks);
}

void Metrics::setTransports(std::vector<std::string> transports,
                            std::vector<std::string> control_transports) {
  std::lock_guard<std::mutex> lock(mutex_);
  transports_ = std::move(transports);
  control_transports_ = std::move(control_transports);
}

void Metrics::setHostCopy(std::string mode, std::string reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  host_copy_ = std::move(mode);
  host_copy_reason_ = std::move(reason);
}

void Metrics::setCpuBinding(std::string cpus) {
  std::lock_guard<std::mutex> lock(mutex_);
  cpu_binding_ = std::move(cpus);
}

void Metrics::setSharedOutputs(bool on, std::string reason) {
  std::lock_guard<std::mutex> lock(mutex_);
  shared_outputs_ = on;
  shared_outputs_reason_ = std::move(reason);
}

void Metrics::setDevicePath(int32_t process_set, const std::string& path, int device) {
  std::lock_guard<std::mutex> lock(mutex_);
  device_paths_.push_back({process_set, path, device});
}

MetricsSnapshot Metrics::snapshot() const {
  MetricsSnapshot s;
  for (int k = 0; k < kNumOpKinds; ++k) {
    s.ops[k] = ops_[k].load(std::memory_order_relaxed);
    s.bytes[k] = bytes_[k].load(std::memory_order_relaxed);
  }
  s.fused_batches = fused_batches_.load(std::memory_order_relaxed);
  s.fused_tensors = fused_tensors_.load(std::memory_order_relaxed);
  s.negotiate_seconds = negotiate_us_.load(std::memory_order_relaxed) / 1e6;
  s.communicate_seconds = communicate_us_.load(std::memory_order_relaxed) / 1e6;
  s.wait_seconds = wait_us_.load(std::memory_order_relaxed) / 1e6;
  s.handle_wait_seconds = handle_wait_ns_.load(std::memory_order_relaxed) / 1e9;
  const int64_t blocked_since = main_blocked_since_ns_.load(std::memory_order_relaxed);
  if (blocked_since != 0) {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
        std::chrono::steady_clock::now().time_since_epoch()).count();
    s.main_blocked_seconds = (now - blocked_since) / 1e9;
  }
  s.caller_driven_ops = driven_.load(std::memory_order_relaxed);
  s.caller_polled_ops = polled_.load(std::memory_order_relaxed);
  s.caller_spin_extended = spin_extended_.load(std::memory_order_relaxed);
  s.one_round_ops = one_round_ops_.load(std::memory_order_relaxed);
  s.caller_spin_skipped = spin_skipped_.load(std::memory_order_relaxed);
  s.caller_passes = caller_passes_.load(std::memory_order_relaxed);
  s.loop_wakeups = loop_wakeups_.load(std::memory_order_relaxed);
  s.tick_pickups = tick_pickups_.load(std::memory_order_relaxed);
  s.p2p_sent = p2p_sent_.load(std::memory_order_relaxed);
  s.p2p_sent_bytes = p2p_sent_bytes_.load(std::memory_order_relaxed);
  s.p2p_received = p2p_received_.load(std::memory_order_relaxed);
  s.p2p_received_bytes = p2p_received_bytes_.load(std::memory_order_relaxed);
  s.p2p_split_sent = p2p_split_sent_.load(std::memory_order_relaxed);
  s.p2p_split_received = p2p_split_received_.load(std::memory_order_relaxed);
  s.p2p_split_refused = p2p_split_refused_.load(std::memory_order_relaxed);
  s.caller_spin_us = caller_spin_us_.load(std::memory_order_relaxed);
  s.spin_yields = spin_yields_.load(std::memory_order_relaxed);
  s.queue_depth = queue_depth_.load(std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(mutex_);
  s.last_error = last_error_;
  s.current_op = current_op_;
  s.current_name = current_name_;
  if (!current_op_.empty()) {
    s.current_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() -
                                                      current_since_).count();
  }
  s.pending = pending_;
  s.shutting_down = shutting_down_;
  s.transports = transports_;
  s.control_transports = control_transports_;
  s.cpu_binding = cpu_binding_;
  s.host_copy = host_copy_;
  s.host_copy_reason = host_copy_reason_;
  s.shared_outputs = shared_outputs_;
  s.shared_outputs_reason = shared_outputs_reason_;
  s.device_paths = device_paths_;
  return s;
}

void Metrics::reset() {
  for (int k = 0; k < kNumOpKinds; ++k) {
    ops_[k].store(0, std::memory_order_relaxed);
    bytes_[k].store(0, std::memory_order_relaxed);
  }
  fused_batches_ = 0;
  fused_tensors_ = 0;
  negotiate_us_ = 0;
  communicate_us_ = 0;
  wait_us_ = 0;
  handle_wait_ns_ = 0;
  driven_ = 0;
  polled_ = 0;
  spin_extended_ = 0;
  one_round_ops_ = 0;
  spin_skipped_ = 0;
  caller_passes_ = 0;
  loop_wakeups_ = 0;
  tick_pickups_ = 0;
  p2p_sent_ = 0;
  p2p_sent_bytes_ = 0;
  p2p_received_ = 0;
  p2p_received_bytes_ = 0;
  p2p_split_sent_ = 0;
  p2p_split_received_ = 0;
  p2p_split_refused_ = 0;
  caller_spin_us_ = 0;
  spin_yields_ = false;
  queue_depth_ = 0;
  std::lock_guard<std::mutex> lock(mutex_);
  last_error_.clear();
  current_op_.clear();
  current_name_.clear();
  device_paths_.clear();
  pending_.clear();
  shutting_down_.clear();
  transports_.clear();
  control_transports_.clear();
  cpu_binding_.clear();
  host_copy_.clear();
  host_copy_reason_.clear();
  shared_outputs_ = false;
  shared_outputs_reason_.clear();
}

}  // namespace hvd::runtime
