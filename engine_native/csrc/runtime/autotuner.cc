// Autotuner (runtime/autotuner.h). Protocol, on rank 0:
//   a. each executed global-set allreduce tensor goes to the StepMeter; a finished step goes
//      to ParameterManager::update;
//   b. when update() reports a new setting (or a new phase), it becomes pending; the loop
//      attaches it to the next ResponseList it sends (takePending) and applies it itself at
//      that point;
//   c. every rank calls applied() where it switches (Rule in coord/message.h, ParamsUpdate),
//      so each rank's `switches` list names the same response index for the same setting.
#include "runtime/autotuner.h"

#include <algorithm>

#include "common/logging.h"

namespace hvd::runtime {

using autotune::AutotunePhase;
using autotune::TunedParams;

coord::ParamsUpdate toUpdate(const TunedParams& p, const autotune::AutotuneState& s) {
  coord::ParamsUpdate u;
  u.fusion_threshold_bytes = p.fusion_threshold_bytes;
  u.cycle_time_ms = p.cycle_time_ms;
  u.cache_enabled = p.cache_enabled;
  u.hierarchical_allreduce = p.hierarchical_allreduce;
  u.phase = static_cast<int32_t>(s.phase);
  u.trial = std::max(0, s.trial);
  u.trials = std::max(0, s.trials);
  return u;
}

TunedParams fromUpdate(const coord::ParamsUpdate& u) {
  TunedParams p;
  p.fusion_threshold_bytes = u.fusion_threshold_bytes;
  p.cycle_time_ms = u.cycle_time_ms;
  p.cache_enabled = u.cache_enabled;
  p.hierarchical_allreduce = u.hierarchical_allreduce;
  return p;
}

Autotuner::Autotuner(const common::Config& config, int rank, int num_hosts)
    : config_(config), rank_(rank), num_hosts_(num_hosts) {
  applied_.fusion_threshold_bytes = config.fusion_threshold_bytes;
  applied_.cycle_time_ms = config.cycle_time_ms;
  applied_.cache_enabled = config.cache_capacity > 0;
  applied_.hierarchical_allreduce = config.hierarchical_allreduce;
  if (config.autotune) setEnabled(true);
}

autotune::AutotuneOptions Autotuner::options() const {
  autotune::AutotuneOptions o;
  o.warmup_samples = static_cast<int>(std::min<int64_t>(config_.autotune_warmup_samples, 1 << 20));
  o.steps_per_sample =
      static_cast<int>(std::min<int64_t>(config_.autotune_steps_per_sample, 1 << 20));
  o.bayes_max_samples =
      static_cast<int>(std::min<int64_t>(config_.autotune_bayes_opt_max_samples, 1 << 20));
  o.gp_noise = config_.autotune_gaussian_process_noise;
  o.log_path = config_.autotune_log;
  o.num_hosts = num_hosts_;
  o.fixed_fusion_threshold = config_.fusion_threshold_set;
  o.fixed_cycle_time = config_.cycle_time_set;
  o.fixed_cache = config_.cache_capacity_set;
  o.fixed_hierarchical = config_.hierarchical_allreduce_set;
  return o;
}

void Autotuner::setEnabled(bool enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (enabled == enabled_) return;
  enabled_ = enabled;
  if (rank_ != 0) return;
  observing_.store(enabled, std::memory_order_relaxed);
  if (enabled) {
    startLocked();
    return;
  }
  // Off: settle on the best setting scored so far (if any), like a finished run; the update
  // (phase "done") also tells every other rank that tuning stopped.
  if (manager_) {
    const autotune::AutotuneState s = manager_->state();
    queueLocked(s.history.empty() ? applied_ : s.best);
  }
  meter_.reset();
}

void Autotuner::setParams(const TunedParams& params) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (rank_ != 0) return;
  enabled_ = false;
  observing_.store(false, std::memory_order_relaxed);
  meter_.reset();
  queueLocked(params);
}

void Autotuner::startLocked() {
  const TunedParams initial = applied_;
  const autotune::AutotuneOptions options = this->options();
  manager_ = std::make_unique<autotune::ParameterManager>(initial, options);
  meter_.reset();
  const bool bayes = (!options.fixed_fusion_threshold || !options.fixed_cycle_time) &&
                     options.bayes_max_samples > 0;
  const int categoricals = (options.fixed_cache ? 0 : 1) +
                           (num_hosts_ > 1 && !options.fixed_hierarchical ? 1 : 0);
  // The finalists' re-measurement is part of the Bayesian budget (Note [Finalists]); each
  // on/off knob scores 2 settings, measured interleaved (Note [Categorical trials]).
  planned_ = (bayes ? options.bayes_max_samples : 0) + 2 * categoricals;
  // Every rank learns at once that tuning runs (and its phase); with nothing continuous to
  // search and no warm-up, this is also the first trial's setting.
  queueLocked(manager_->currentParams());
  HVD_LOG(kInfo, "autotune") << "autotune: on, " << planned_ << " settings to score";
}

void Autotuner::queueLocked(const TunedParams& params) {
  autotune::AutotuneState s;
  if (manager_) s = manager_->state();
  if (!enabled_) s.phase = AutotunePhase::kDone;
  pending_ = toUpdate(params, s);
  has_pending_.store(true, std::memory_order_release);
  queued_phase_ = pending_->phase;
}

void Autotuner::observe(const std::string& name, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!enabled_ || !manager_ || !manager_->active()) return;
  int64_t step_bytes = 0;
  double step_seconds = 0.0;
  if (!meter_.observe(name, bytes, autotune::StepMeter::Clock::now(), &step_bytes,
                      &step_seconds)) {
    return;
  }
  // A new setting, or a new phase with the same setting (so every rank reports the phase).
  const bool changed = manager_->update(step_bytes, step_seconds);
  if (changed || static_cast<int32_t>(manager_->state().phase) != queued_phase_) {
    queueLocked(manager_->currentParams());
  }
}

std::optional<coord::ParamsUpdate> Autotuner::takePending() {
  if (!has_pending_.load(std::memory_order_acquire)) return std::nullopt;  // every pass asks
  std::lock_guard<std::mutex> lock(mutex_);
  std::optional<coord::ParamsUpdate> out;
  out.swap(pending_);
  has_pending_.store(false, std::memory_order_relaxed);
  return out;
}

TunedParams Autotuner::applied(const coord::ParamsUpdate& update, uint64_t responses_before) {
  std::lock_guard<std::mutex> lock(mutex_);
  applied_ = fromUpdate(update);
  phase_ = autotune::phaseName(static_cast<AutotunePhase>(update.phase));
  trial_ = update.trial;
  trials_ = update.trials;
  if (rank_ != 0 && update.phase != static_cast<int32_t>(AutotunePhase::kDone)) enabled_ = true;
  if (switches_.size() < 4096) switches_.push_back({responses_before, applied_, phase_});
  HVD_LOG(kInfo, "autotune") << "autotune: applying " << autotune::describe(applied_) << " ("
                             << phase_ << ")";
  return applied_;
}

AutotuneReport Autotuner::report() const {
  std::lock_guard<std::mutex> lock(mutex_);
  AutotuneReport r;
  r.enabled = enabled_;
  r.tuner = rank_ == 0 && manager_ != nullptr;
  r.phase = phase_;
  r.applied_phase = phase_.empty() ? "off" : phase_;
  r.trial = trial_;
  r.trials = trials_;
  r.planned_settings = planned_;
  r.applied = applied_;
  r.switches = switches_;
  if (manager_) {
    r.state = manager_->state();
    r.phase = enabled_ ? autotune::phaseName(r.state->phase) : "off";
    r.trial = r.state->trial;
    r.trials = r.state->trials;
  } else if (r.phase.empty()) {
    r.phase = "off";
  }
  return r;
}

}  // namespace hvd::runtime
