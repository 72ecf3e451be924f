#include "autotune/parameter_manager.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/logging.h"
#include "common/text.h"

namespace hvd::autotune {

// The chain, as Horovod runs it (its parameter_manager):
//   a. warm-up: the first warmup_samples samples are discarded (caches, allocators settle);
//   b. Bayesian: fusion threshold x cycle time, jointly (the threshold on a log axis, Note
//      [Fusion axis]); the first setting is the initial one,
//      then a space-filling design, then expected-improvement proposals; the phase keeps the
//      setting the refitted model rates highest, then re-measures its finalists (Note
//      [Finalists]); bayes_max_samples settings in all, the finalists included;
//   c. categorical: each on/off knob in turn (hierarchical allreduce, only with several hosts;
//      response cache) is tried both ways on top of the best setting so far, off and on
//      measured interleaved (Note [Categorical trials]); 2 settings per knob;
//   d. done: the best setting measured is applied for good.
// A sample is steps_per_sample update() calls, scored bytes / seconds; a setting's score is the
// median of samples_per_setting samples. Knobs the user fixed are left out of every phase.

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr int64_t kFusionGranule = 4096;  // tuned thresholds are whole pages

// Note [Fusion axis]: the fusion threshold is searched as log2(bytes). A linear 0..128 MiB axis
// leaves the region that matters for jobs of many small tensors (64 KiB .. 4 MiB) under 3% of
// the box, so the space-filling design and the model's proposals almost never visit it. The log
// axis runs from kFusionLogOff to log2(max(fusion_max_bytes, initial)); the band below
// kFusionLogFloor (16 KiB, the smallest positive threshold searched) stands for threshold 0,
// fusion off, which therefore stays reachable (and measured settings with threshold 0 sit at
// the axis's lower end). Thresholds are rounded to whole pages.
constexpr double kFusionLogFloor = 14.0;  // log2(16 KiB)
constexpr double kFusionLogOff = kFusionLogFloor - 0.5;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// Settings of the Bayesian budget held back for the finalists (Note [Finalists]): `finalists`
// plus the start, at most half the budget (the model needs proposals to rate), and none when
// fewer than 2 (nothing to compare), which also leaves at least 2 proposals.
int finalistsReserved(int finalists, int budget) {
  const int reserved = finalists > 0 ? std::min(finalists + 1, budget / 2) : 0;
  return reserved >= 2 ? reserved : 0;
}

}  // namespace

bool operator==(const TunedParams& a, const TunedParams& b) {
  return a.fusion_threshold_bytes == b.fusion_threshold_bytes &&
         a.cycle_time_ms == b.cycle_time_ms && a.cache_enabled == b.cache_enabled &&
         a.hierarchical_allreduce == b.hierarchical_allreduce;
}

std::string describe(const TunedParams& p) {
  common::Text os;
  os.fixed(2);
  os << "fusion " << p.fusion_threshold_bytes / kMiB << " MiB, cycle " << p.cycle_time_ms
     << " ms, cache " << (p.cache_enabled ? "on" : "off") << ", hierarchical allreduce "
     << (p.hierarchical_allreduce ? "on" : "off");
  return os.str();
}

const char* phaseName(AutotunePhase phase) {
  switch (phase) {
    case AutotunePhase::kWarmup: return "warmup";
    case AutotunePhase::kBayes: return "bayes";
    case AutotunePhase::kCategorical: return "categorical";
    case AutotunePhase::kDone: return "done";
  }
  return "unknown";
}

ParameterManager::ParameterManager(const TunedParams& initial, AutotuneOptions options)
    : options_(std::move(options)), current_(initial) {
  options_.steps_per_sample = std::max(1, options_.steps_per_sample);
  options_.samples_per_setting = std::max(1, options_.samples_per_setting);
  options_.bayes_max_samples = std::max(0, options_.bayes_max_samples);
  proposals_ = options_.bayes_max_samples -
               finalistsReserved(options_.finalists, options_.bayes_max_samples);
  fusion_dim_ = !options_.fixed_fusion_threshold;
  cycle_dim_ = !options_.fixed_cycle_time;
  if (options_.num_hosts > 1 && !options_.fixed_hierarchical) {
    categoricals_.push_back({&TunedParams::hierarchical_allreduce, "hierarchical_allreduce"});
  }
  if (!options_.fixed_cache) {
    categoricals_.push_back({&TunedParams::cache_enabled, "cache_enabled"});
  }
  if (!options_.log_path.empty()) {
    log_ = std::fopen(options_.log_path.c_str(), "w");
    if (log_ == nullptr) {
      HVD_LOG(kWarning, "autotune") << "autotune: cannot write the log '" << options_.log_path
                                    << "'; tuning continues without it";
    } else {
      std::fputs("hierarchical_allreduce,hierarchical_allgather,torus_allreduce,cache_enabled,"
                 "cycle_time_ms,tensor_fusion_threshold,score\n", log_);
      std::fflush(log_);
    }
  }
  state_.current = state_.best = current_;
  warmup_left_ = std::max(0, options_.warmup_samples);
  const bool bayes = (fusion_dim_ || cycle_dim_) && options_.bayes_max_samples > 0;
  if (!bayes && categoricals_.empty()) {
    finish();
  } else if (warmup_left_ > 0) {
    state_.phase = AutotunePhase::kWarmup;
    state_.trial = 1;
    state_.trials = warmup_left_;
  } else {
    beginTuning();
  }
  HVD_LOG(kInfo, "autotune") << "autotune: starting from " << describe(current_) << " ("
                             << phaseName(state_.phase) << ")";
}

ParameterManager::~ParameterManager() {
  if (log_ != nullptr) std::fclose(log_);
}

bool ParameterManager::update(int64_t bytes, double seconds) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_.phase == AutotunePhase::kDone) return false;
  if (discard_steps_ > 0) {
    --discard_steps_;
    return false;
  }
  step_bytes_ += std::max<int64_t>(0, bytes);
  step_seconds_ += std::max(0.0, seconds);
  if (++steps_ < options_.steps_per_sample) return false;
  const double score = step_seconds_ > 0 ? static_cast<double>(step_bytes_) / step_seconds_ : 0.0;
  steps_ = 0;
  step_bytes_ = 0;
  step_seconds_ = 0.0;
  return onSample(score);
}

TunedParams ParameterManager::currentParams() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return current_;
}

bool ParameterManager::active() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_.phase != AutotunePhase::kDone;
}

AutotuneState ParameterManager::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return state_;
}

bool ParameterManager::onSample(double score) {
  if (state_.phase == AutotunePhase::kWarmup) {
    if (--warmup_left_ > 0) {
      ++state_.trial;
      return false;
    }
    return beginTuning();
  }
  if (!finalists_.empty()) return onFinalistSample(score);
  if (state_.phase == AutotunePhase::kCategorical) return onCategoricalSample(score);
  samples_.push_back(score);
  state_.samples = static_cast<int>(samples_.size());
  if (static_cast<int>(samples_.size()) < options_.samples_per_setting) return false;
  const double setting_score = median(samples_);
  samples_.clear();
  return onSettingScored(setting_score);
}

bool ParameterManager::beginTuning() {
  if (!(fusion_dim_ || cycle_dim_) || options_.bayes_max_samples == 0) return beginCategorical();
  // The box always contains the initial setting, which is measured first as the baseline.
  std::vector<double> lower, upper;
  if (fusion_dim_) {
    lower.push_back(kFusionLogOff);
    upper.push_back(std::log2(std::max<double>(
        {static_cast<double>(options_.fusion_max_bytes),
         static_cast<double>(current_.fusion_threshold_bytes), 1.0})));
  }
  if (cycle_dim_) {
    lower.push_back(std::max(0.0, std::min(options_.cycle_min_ms, current_.cycle_time_ms)));
    upper.push_back(std::max(options_.cycle_max_ms, current_.cycle_time_ms));
  }
  for (size_t i = 0; i < lower.size(); ++i) upper[i] = std::max(upper[i], lower[i] + 1e-3);
  BayesOptions bayes;
  bayes.noise = options_.gp_noise;
  bayes.seed = options_.seed;
  optimizer_ = std::make_unique<BayesianOptimizer>(lower, upper, bayes);
  state_.phase = AutotunePhase::kBayes;
  state_.trial = 1;
  state_.trials = options_.bayes_max_samples;
  state_.samples = 0;
  return false;
}

// Samples are noisy (a shared machine's load comes in bursts of seconds, longer than a
// setting's samples): the Bayesian phase keeps the setting the refitted model rates highest,
// not the luckiest measurement (BayesianOptimizer::recommend). The phase's settings are the
// first entries of the history, in the optimizer's order.
void ParameterManager::keepRecommendation() {
  const int chosen = optimizer_ ? optimizer_->recommend() : -1;
  if (chosen < 0 || static_cast<size_t>(chosen) >= state_.history.size()) return;
  const AutotuneTrial& kept = state_.history[chosen];
  if (kept.params != state_.best) {
    HVD_LOG(kInfo, "autotune") << "autotune: keeping " << describe(kept.params) << " ("
                               << kept.score / kMiB << " MiB/s measured) over the luckiest "
                               << describe(state_.best) << " (" << state_.best_score / kMiB
                               << " MiB/s): the model rates it higher";
  }
  state_.best = kept.params;
  state_.best_score = kept.score;
}

// Note [Finalists]: on a shared machine the load drifts over seconds, longer than a setting's
// samples, so settings measured one after another are compared under different loads. The
// Bayesian phase therefore ends by re-measuring its finalists (the settings the model rates
// highest, plus the starting setting as the baseline to beat) interleaved: one sample each in
// turn, samples_per_setting rounds, so every finalist sees the same load. The first step after
// each switch is discarded (it ran the previous setting). The finalist with the best median is
// kept; each finalist's re-measurement is another history entry (phase bayes).
// The re-measurement comes out of the phase's budget (Horovod's default sample budget is the
// target of issue #4): finalistsReserved() settings are held back from the optimizer's
// proposals, and the finalists fill them (the start, then the best rated distinct settings),
// so the phase scores bayes_max_samples settings unless too few distinct ones were proposed.
// Returns false when there is nothing to re-measure; *changed: the parameters changed.
bool ParameterManager::beginFinalists(bool* changed) {
  const size_t reserved = static_cast<size_t>(options_.bayes_max_samples - proposals_);
  if (reserved == 0 || !optimizer_ || state_.history.empty()) return false;
  const std::vector<double> means = optimizer_->posteriorMeans();
  std::vector<size_t> order(std::min(means.size(), state_.history.size()));
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return means[a] > means[b]; });
  const TunedParams start = state_.history.front().params;  // the baseline to beat
  finalists_.clear();
  for (size_t i = 0; i < order.size() && finalists_.size() + 1 < reserved; ++i) {
    const TunedParams& p = state_.history[order[i]].params;
    if (p != start && std::find(finalists_.begin(), finalists_.end(), p) == finalists_.end()) {
      finalists_.push_back(p);
    }
  }
  finalists_.push_back(start);
  if (finalists_.size() < 2) {
    finalists_.clear();
    return false;
  }
  finalist_scores_.assign(finalists_.size(), {});
  finalist_turn_ = 0;
  state_.trials = proposals_ + static_cast<int>(finalists_.size());  // the budget, if filled
  state_.trial = proposals_ + 1;
  discard_steps_ = 1;
  *changed = switchTo(finalists_[0]);
  return true;
}

bool ParameterManager::onFinalistSample(double score) {
  const size_t n = finalists_.size();
  finalist_scores_[finalist_turn_ % n].push_back(score);
  ++finalist_turn_;
  if (finalist_turn_ < n * static_cast<size_t>(options_.samples_per_setting)) {
    state_.trial = proposals_ + 1 + static_cast<int>(finalist_turn_ % n);
    discard_steps_ = 1;
    const bool changed = switchTo(finalists_[finalist_turn_ % n]);
    state_.samples = static_cast<int>(finalist_turn_ / n);
    return changed;
  }
  const TunedParams running = current_;
  size_t kept = 0;
  std::vector<double> scores(n);
  for (size_t i = 0; i < n; ++i) {
    scores[i] = median(finalist_scores_[i]);
    if (scores[i] > scores[kept]) kept = i;
    current_ = finalists_[i];
    record(scores[i]);
  }
  HVD_LOG(kInfo, "autotune") << "autotune: finalists re-measured; keeping "
                             << describe(finalists_[kept]) << " at " << scores[kept] / kMiB
                             << " MiB/s";
  state_.best = finalists_[kept];
  state_.best_score = scores[kept];
  current_ = finalists_[kept];
  finalists_.clear();
  finalist_scores_.clear();
  state_.trial = state_.trials;
  beginCategorical();
  return current_ != running;
}

// Note [Categorical trials]: each on/off knob is compared like the finalists (Note
// [Finalists]): on top of the best setting so far, off and on are measured interleaved, one
// sample each in turn for samples_per_setting rounds, the first step after each switch
// discarded, so both values see the same load; a single lucky sample cannot win. The value
// with the better median is kept (ties keep off) and becomes the best setting with that score,
// whatever earlier phases measured under other loads. Each knob is 2 history entries (off,
// then on) and costs what 2 settings measured one after another would: 2 x samples_per_setting
// samples, plus the discarded steps. This phase is Horovod's extra beyond the Bayesian budget.
bool ParameterManager::beginCategorical() {
  state_.phase = AutotunePhase::kCategorical;
  categorical_index_ = 0;
  if (categoricals_.empty()) return finish();
  state_.trials = 2 * static_cast<int>(categoricals_.size());
  return beginCategoricalKnob(state_.history.empty() ? current_ : state_.best);
}

bool ParameterManager::beginCategoricalKnob(const TunedParams& base) {
  const auto field = categoricals_[categorical_index_].field;
  categorical_settings_[0] = categorical_settings_[1] = base;
  categorical_settings_[0].*field = false;
  categorical_settings_[1].*field = true;
  categorical_scores_[0].clear();
  categorical_scores_[1].clear();
  categorical_turn_ = 0;
  state_.trial = 2 * static_cast<int>(categorical_index_) + 1;
  discard_steps_ = 1;
  return switchTo(categorical_settings_[0]);
}

bool ParameterManager::onCategoricalSample(double score) {
  categorical_scores_[categorical_turn_ % 2].push_back(score);
  ++categorical_turn_;
  if (categorical_turn_ < 2 * static_cast<size_t>(options_.samples_per_setting)) {
    const size_t side = categorical_turn_ % 2;
    state_.trial = 2 * static_cast<int>(categorical_index_) + 1 + static_cast<int>(side);
    discard_steps_ = 1;
    const bool changed = switchTo(categorical_settings_[side]);
    state_.samples = static_cast<int>(categorical_turn_ / 2);
    return changed;
  }
  const TunedParams running = current_;
  double scores[2];
  for (size_t i = 0; i < 2; ++i) {
    scores[i] = median(categorical_scores_[i]);
    state_.trial = 2 * static_cast<int>(categorical_index_) + 1 + static_cast<int>(i);
    current_ = categorical_settings_[i];
    record(scores[i]);
  }
  const size_t kept = scores[1] > scores[0] ? 1 : 0;
  HVD_LOG(kInfo, "autotune") << "autotune: " << categoricals_[categorical_index_].name
                             << " off " << scores[0] / kMiB << " MiB/s, on " << scores[1] / kMiB
                             << " MiB/s (interleaved); keeping " << (kept ? "on" : "off");
  state_.best = categorical_settings_[kept];
  state_.best_score = scores[kept];
  current_ = running;  // what the ranks run until the switch below
  if (++categorical_index_ >= categoricals_.size()) return finish();
  return beginCategoricalKnob(state_.best);
}

bool ParameterManager::onSettingScored(double score) {
  record(score);
  // The Bayesian phase (the categorical one scores its settings in onCategoricalSample).
  optimizer_->addSample(bayesPoint(current_), score);
  if (state_.trial >= proposals_) {
    keepRecommendation();
    bool changed = false;
    return beginFinalists(&changed) ? changed : beginCategorical();
  }
  ++state_.trial;
  return switchTo(fromBayesPoint(optimizer_->nextSample()));
}

bool ParameterManager::finish() {
  state_.phase = AutotunePhase::kDone;
  state_.trials = static_cast<int>(state_.history.size());
  state_.trial = state_.trials;
  if (state_.history.empty()) return false;
  writeCsvRow(state_.best, state_.best_score);
  HVD_LOG(kInfo, "autotune") << "autotune: done after " << state_.history.size()
                             << " settings; best " << describe(state_.best) << " at "
                             << state_.best_score / kMiB << " MiB/s";
  return switchTo(state_.best);
}

void ParameterManager::record(double score) {
  state_.history.push_back(AutotuneTrial{current_, score, state_.phase});
  if (state_.history.size() == 1 || score > state_.best_score) {
    state_.best = current_;
    state_.best_score = score;
  }
  writeCsvRow(current_, score);
  HVD_LOG(kDebug, "autotune") << "autotune: " << phaseName(state_.phase) << " " << state_.trial
                              << "/" << state_.trials << " " << describe(current_) << ": "
                              << score / kMiB << " MiB/s";
}

void ParameterManager::writeCsvRow(const TunedParams& p, double score) {
  if (log_ == nullptr) return;
  std::fprintf(log_, "%d,0,0,%d,%.6g,%.9g,%.10g\n", p.hierarchical_allreduce ? 1 : 0,
               p.cache_enabled ? 1 : 0, p.cycle_time_ms, p.fusion_threshold_bytes / kMiB, score);
  std::fflush(log_);
}

Point ParameterManager::bayesPoint(const TunedParams& p) const {
  Point x;
  if (fusion_dim_) {
    const int64_t bytes = p.fusion_threshold_bytes;
    x.push_back(bytes <= 0 ? kFusionLogOff
                           : std::max(kFusionLogFloor, std::log2(static_cast<double>(bytes))));
  }
  if (cycle_dim_) x.push_back(p.cycle_time_ms);
  return x;
}

TunedParams ParameterManager::fromBayesPoint(const Point& x) const {
  TunedParams p = current_;
  size_t i = 0;
  if (fusion_dim_) {
    const double v = x[i++];
    if (v < kFusionLogFloor) {
      p.fusion_threshold_bytes = 0;  // fusion off (Note [Fusion axis])
    } else {
      const double granules = std::round(std::exp2(v) / kFusionGranule);
      p.fusion_threshold_bytes = static_cast<int64_t>(granules) * kFusionGranule;
    }
  }
  if (cycle_dim_) p.cycle_time_ms = std::round(x[i] * 100.0) / 100.0;
  return p;
}

bool ParameterManager::switchTo(const TunedParams& next) {
  const bool changed = next != current_;
  current_ = next;
  state_.current = next;
  state_.samples = 0;
  samples_.clear();
  return changed;
}

}  // namespace hvd::autotune
