// RankZeroCoordinator: what rank 0 alone keeps for BackgroundLoop (background_loop.h): the
// coordinator (coord/coordinator.h) requests are admitted into as they arrive (the workers'
// decoded against mirrors of their request caches), NEGOTIATE_<OP> spans, the batching window,
// the process sets it knows, the autotune setting in force and the shutdown votes. The loop
// calls it each pass (coordinate() steps a-d in loop_pass.cc) and sends what it releases.
// Rank 0 only; background thread only (whichever thread holds the loop's progress_).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "coord/coordinator.h"
#include "coord/key_table.h"
#include "coord/message.h"
#include "coord/response_cache.h"
#include "runtime/autotuner.h"
#include "runtime/batching_window.h"
#include "runtime/process_sets.h"
#include "timeline/timeline.h"

namespace hvd::runtime {

class RankZeroCoordinator {
 public:
  using Clock = std::chrono::steady_clock;

  // `autotuner` may be null; it, `keys`, `sets` and `config` outlive this.
  RankZeroCoordinator(int world_size, coord::KeyTable& keys, ProcessSetTable& sets,
                      const common::Config& config, Autotuner* autotuner);

  // ---- each pass, before anything is admitted (coordinate() step b) ----
  void syncProcessSets();
  void adoptTunedParams();
  // A registered set leaves rank 0 out: only the loop thread can answer its requests (Note
  // [Caller drives] B).
  bool coordinatesOtherSets() const { return coordinates_other_sets_; }

  // ---- requests in (timeline: NEGOTIATE_<OP> spans while non-null) ----
  void admit(coord::Key key, const coord::Request& request, int32_t rank,
             timeline::Timeline* timeline, Clock::time_point now);
  // A worker's kRequests payload, decoded against its mirror; an error means it is malformed.
  common::Status admitRequests(int from, const std::string& payload,
                               timeline::Timeline* timeline, Clock::time_point now);
  void admitParked(timeline::Timeline* timeline);  // coordinate() step a

  // ---- responses out ----
  // coordinate() step c: what is ready now goes into the window (released at `now`).
  void release(Clock::time_point now, timeline::Timeline* timeline);
  // coordinate() step d: the held batch is to be sent now. `own_blocked`: a caller of rank 0
  // is in wait() and every own tensor in flight is in the batch (BatchingWindow::hold).
  bool sendNow(bool own_blocked) const {
    return !window_.empty() && !window_.hold(negotiating_allreduces_, own_blocked);
  }
  // The held batch and the autotune setting not sent yet (which goes with it).
  std::vector<coord::Response> takeBatch(std::optional<coord::ParamsUpdate>* params);
  void dropBatch() { window_.take(); }  // the core failed or shuts down
  const BatchingWindow& window() const { return window_; }
  // After executing (Note [Batching window]); `own_busy`: tensors of this rank in flight.
  void noteStepBoundary(bool own_busy) { window_.noteStepBoundary(negotiating_ != 0 || own_busy); }
  // Nothing held or parked.
  bool idle() const { return window_.empty() && parked_.empty(); }

  // ---- stalls, shutdown, keys ----
  std::vector<int> missingRanks(coord::Key key) const { return coordinator_.missingRanks(key); }
  std::string stallReport(std::chrono::seconds threshold) const {
    return coordinator_.stallReport(threshold);
  }
  std::string failDeadlocked(Clock::time_point now, std::chrono::duration<double> after) {
    return coordinator_.failDeadlocked(now, after);
  }
  void noteShutdown(int rank) { shutdown_ranks_.insert(rank); }
  int shutDownRanks() const { return static_cast<int>(shutdown_ranks_.size()); }
  bool hasShutDown(int rank) const { return shutdown_ranks_.count(rank) != 0; }
  std::vector<int> shutDownRankList() const {
    return {shutdown_ranks_.begin(), shutdown_ranks_.end()};
  }
  // Marks the keys rank 0's tables still refer to (Note [Key lifetime] in key_table.cc).
  void markKeys(const coord::KeyTable::MarkFn& mark) const;

 private:
  NameState& nameState(coord::Key key);
  void noteReleased(const std::vector<coord::Response>& ready, timeline::Timeline* timeline);

  coord::KeyTable& keys_;
  ProcessSetTable& sets_;
  const common::Config& config_;
  Autotuner* autotuner_;
  coord::Coordinator coordinator_;
  // Workers' request caches as rank 0 decodes against them, by worker rank.
  std::map<int, std::unique_ptr<coord::RequestCache>> mirrors_;
  std::vector<coord::Request> parked_;  // requests (with request_rank, key) for sets not yet
                                        // registered
  std::set<int32_t> registered_sets_;  // sets coordinator_ knows
  uint64_t sets_version_ = 0;          // sets_.version() registered_sets_ was synced at
  bool coordinates_other_sets_ = false;
  std::set<int> shutdown_ranks_;  // ranks (0 included) that agreed to shut down
  // Names with at least one request and not yet released (NameState::negotiating):
  // NEGOTIATE_<OP> spans are open for them, and while an allreduce is among them the batching
  // window may hold ready responses.
  std::vector<NameState> names_;
  size_t negotiating_ = 0;
  size_t negotiating_allreduces_ = 0;
  BatchingWindow window_;  // after names_, which it reads
  bool cache_enabled_ = true;                         // in force (autotune may change it)
  std::optional<coord::ParamsUpdate> unsent_params_;  // goes with the next list sent
};

}  // namespace hvd::runtime
