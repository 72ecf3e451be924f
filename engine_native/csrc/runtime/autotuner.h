// Autotuner: the runtime's side of autotune (issue #4). On rank 0, with HVD_AUTOTUNE=1 or
// after set_autotune(True), it owns a ParameterManager, feeds it one StepMeter step at a time
// from the executed global-set allreduces, and hands the loop each new setting to attach to the
// next ResponseList (coord::ParamsUpdate). On every rank it records the settings applied, and
// where in the response stream they were applied, so Python can read the state on any rank.
// The background thread calls observe/takePending/applied; any thread calls report/setEnabled.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "autotune/parameter_manager.h"
#include "autotune/step_meter.h"
#include "common/config.h"
#include "coord/message.h"

namespace hvd::runtime {

struct AppliedParams {
  uint64_t responses_before = 0;  // global-set responses this rank executed before applying
  autotune::TunedParams params;
  std::string phase;              // phase rank 0 was in when it sent them
};

struct AutotuneReport {
  bool enabled = false;           // tuning configured on this rank (rank 0: the tuner runs)
  bool tuner = false;             // this rank owns the ParameterManager (rank 0)
  std::string phase;              // rank 0: live; others: as received with the last params
  std::string applied_phase;      // as received with the last params, on every rank: ranks
                                  // agree on it after the same response (rank 0's `phase`
                                  // may be ahead by a batch)
  int trial = 0;
  int trials = 0;
  int planned_settings = 0;       // settings the whole run scores (for "sample k of n")
  autotune::TunedParams applied;  // what this rank runs with now
  std::vector<AppliedParams> switches;       // every update applied (setting or phase)
  std::optional<autotune::AutotuneState> state;  // rank 0 only: the ParameterManager's truth
};

class Autotuner {
 public:
  Autotuner(const common::Config& config, int rank, int num_hosts);

  // Rank 0, background thread: one executed allreduce tensor of the global set.
  void observe(const std::string& name, int64_t bytes);
  // Whether observe() may use what it is given (lock-free; the loop skips the per-tensor calls
  // while tuning is off).
  bool observing() const { return observing_.load(std::memory_order_relaxed); }
  // Rank 0, background thread: the setting to send with the next ResponseList, if any.
  std::optional<coord::ParamsUpdate> takePending();
  // Any rank, background thread: `update` takes effect now, after `responses_before`
  // global-set responses. Returns the parameters to apply.
  autotune::TunedParams applied(const coord::ParamsUpdate& update, uint64_t responses_before);

  // Any thread. Turning tuning off on rank 0 settles on the best setting scored so far.
  void setEnabled(bool enabled);
  // Any thread: rank 0 stops tuning and sends `params` with the next batch (benchmarks' grid
  // search runs through the same switch as autotune). No-op on other ranks.
  void setParams(const autotune::TunedParams& params);
  AutotuneReport report() const;

 private:
  void startLocked();
  void queueLocked(const autotune::TunedParams& params);
  autotune::AutotuneOptions options() const;

  const common::Config config_;
  const int rank_;
  const int num_hosts_;
  mutable std::mutex mutex_;
  bool enabled_ = false;
  std::atomic<bool> observing_{false};  // enabled_ on rank 0
  std::unique_ptr<autotune::ParameterManager> manager_;  // rank 0 while tuning
  autotune::StepMeter meter_;
  std::optional<coord::ParamsUpdate> pending_;
  std::atomic<bool> has_pending_{false};  // pending_ is set (read without the lock)
  int32_t queued_phase_ = -1;  // phase of the newest update queued
  autotune::TunedParams applied_;
  std::string phase_;
  int trial_ = 0;
  int trials_ = 0;
  int planned_ = 0;
  std::vector<AppliedParams> switches_;
};

// The ParamsUpdate <-> TunedParams mapping (phase travels as its AutotunePhase value).
coord::ParamsUpdate toUpdate(const autotune::TunedParams& p, const autotune::AutotuneState& s);
autotune::TunedParams fromUpdate(const coord::ParamsUpdate& u);

}  // namespace hvd::runtime
