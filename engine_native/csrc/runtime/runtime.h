// Runtime: the process-wide core the binding talks to — lifecycle (listen, init, shutdown,
// abort), local validation of enqueued ops (errors raised on the calling rank only), the
// handle table, process sets and metrics. Framework threads call it; it hands entries to the
// BackgroundLoop. One instance per process; init() after shutdown() builds a fresh mesh/loop.
#pragma once

#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "coord/message.h"
#include "runtime/background_loop.h"
#include "runtime/handle_table.h"
#include "runtime/metrics.h"
#include "runtime/process_sets.h"
#include "transport/mesh.h"

namespace hvd::runtime {

struct EnqueueArgs {
  coord::Request request;   // request_rank filled by the runtime
  const void* input = nullptr;
  void* output = nullptr;
};

class Runtime {
 public:
  static Runtime& instance();

  common::Status listen(const std::string& bind_address, int* port);
  common::Status init(int rank, const std::vector<transport::PeerInfo>& peers,
                      const std::string& secret, const std::string& job_id);
  void shutdown();
  void abort(const std::string& reason);
  bool initialized() const;
  int rank() const;
  int size() const;

  // Validates every op (ValueError/TypeError-coded Status on this rank only), then submits
  // them together so a group is negotiated in one batch.
  common::Status enqueue(std::vector<EnqueueArgs> ops, std::vector<int64_t>* handles);
  HandleTable& handles() { return handles_; }

  common::Status addProcessSet(std::vector<int> ranks, int32_t* id);
  common::Status removeProcessSet(int32_t id);
  std::optional<std::vector<int>> processSetRanks(int32_t id) const;
  MetricsSnapshot metrics() const { return metrics_.snapshot(); }
  const common::Config& config() const { return config_; }

 private:
  common::Status validate(coord::Request* request) const;

  mutable std::mutex mutex_;  // lifecycle vs enqueue
  std::unique_ptr<transport::Mesh> mesh_;
  std::unique_ptr<BackgroundLoop> loop_;
  common::Config config_;
  ProcessSetTable sets_;
  HandleTable handles_;
  Metrics metrics_;
  int rank_ = -1;
  int size_ = 0;
};

}  // namespace hvd::runtime
