// ParameterManager: the autotuning state machine (Horovod's chain). Owns the tuned parameters
// of the global process set, every setting's score, the best so far and the CSV log. Rank 0's
// background loop calls update() once per step and, when it returns true, broadcasts
// currentParams() so all ranks switch together; state() is readable from any thread.
#pragma once

#include <cstdint>
#include <cstdio>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "autotune/bayesian_optimizer.h"

namespace hvd::autotune {

// The tuned knobs. Trivially copyable: the runtime may broadcast it as raw bytes.
struct TunedParams {
  int64_t fusion_threshold_bytes = 128ll << 20;
  double cycle_time_ms = 1.0;
  bool cache_enabled = true;
  bool hierarchical_allreduce = false;
};
bool operator==(const TunedParams& a, const TunedParams& b);
inline bool operator!=(const TunedParams& a, const TunedParams& b) { return !(a == b); }
std::string describe(const TunedParams& p);  // "fusion 4.00 MiB, cycle 5.00 ms, cache on, ..."

enum class AutotunePhase { kWarmup, kBayes, kCategorical, kDone };
const char* phaseName(AutotunePhase phase);  // "warmup" | "bayes" | "categorical" | "done"

struct AutotuneOptions {
  int warmup_samples = 3;        // HVD_AUTOTUNE_WARMUP_SAMPLES: first samples discarded
  int steps_per_sample = 10;     // HVD_AUTOTUNE_STEPS_PER_SAMPLE: update() calls per sample
  int samples_per_setting = 5;   // the median of these scores a setting
  int bayes_max_samples = 20;    // HVD_AUTOTUNE_BAYES_OPT_MAX_SAMPLES: settings in that phase,
                                 // the finalists' re-measurement included
  int finalists = 3;             // settings the model rates highest, re-measured interleaved
                                 // with the starting one (Note [Finalists]); 0: none
  double gp_noise = 0.8;         // HVD_AUTOTUNE_GAUSSIAN_PROCESS_NOISE (standardised scores)
  uint64_t seed = 1;
  std::string log_path;          // HVD_AUTOTUNE_LOG: CSV, one row per setting, best last
  int num_hosts = 1;             // hierarchical allreduce is tuned only when > 1
  int64_t fusion_max_bytes = 64ll << 20;  // search box of the Bayesian phase (the threshold
                                          // on a log2 axis, 0 at its lower end)
  double cycle_min_ms = 0.0;
  double cycle_max_ms = 50.0;
  // Knobs the user set explicitly keep their initial value and are not searched.
  bool fixed_fusion_threshold = false;
  bool fixed_cycle_time = false;
  bool fixed_cache = false;
  bool fixed_hierarchical = false;
};

struct AutotuneTrial {
  TunedParams params;
  double score = 0.0;  // bytes reduced per second (median of the setting's samples)
  AutotunePhase phase = AutotunePhase::kBayes;
};

struct AutotuneState {
  AutotunePhase phase = AutotunePhase::kWarmup;
  int trial = 0;          // 1-based index of the setting being measured in this phase
  int trials = 0;         // settings this phase will measure ("trial k of n")
  int samples = 0;        // samples collected for the current setting
  TunedParams current;
  TunedParams best;
  double best_score = 0.0;  // best's measured score; 0 until a setting has been scored
  std::vector<AutotuneTrial> history;
};

class ParameterManager {
 public:
  // Apply currentParams() once after construction: with no warm-up and nothing continuous to
  // search, the first categorical trial already differs from `initial`.
  ParameterManager(const TunedParams& initial, AutotuneOptions options);
  ~ParameterManager();
  ParameterManager(const ParameterManager&) = delete;
  ParameterManager& operator=(const ParameterManager&) = delete;

  // One step ran with currentParams(): `bytes` reduced in `seconds` of wall time. Returns true
  // when currentParams() changed; the caller then makes every rank switch at the same point.
  bool update(int64_t bytes, double seconds);

  TunedParams currentParams() const;
  bool active() const;  // false once tuning is done (or there was nothing to tune)
  AutotuneState state() const;

 private:
  struct Categorical {
    bool TunedParams::*field;
    const char* name;
  };

  bool onSample(double score);
  bool onSettingScored(double score);
  bool beginTuning();
  void keepRecommendation();
  bool beginFinalists(bool* changed);
  bool onFinalistSample(double score);
  bool beginCategorical();
  bool beginCategoricalKnob(const TunedParams& base);
  bool onCategoricalSample(double score);
  bool finish();
  Point bayesPoint(const TunedParams& p) const;
  TunedParams fromBayesPoint(const Point& x) const;
  bool switchTo(const TunedParams& next);
  void record(double score);
  void writeCsvRow(const TunedParams& p, double score);

  AutotuneOptions options_;
  mutable std::mutex mutex_;
  TunedParams current_;
  AutotuneState state_;
  bool fusion_dim_ = false;  // which Bayesian dimensions are searched
  bool cycle_dim_ = false;
  std::unique_ptr<BayesianOptimizer> optimizer_;
  std::vector<Categorical> categoricals_;
  size_t categorical_index_ = 0;  // parameter being tried
  TunedParams categorical_settings_[2];  // its off and on settings, measured in turn
  std::vector<double> categorical_scores_[2];
  size_t categorical_turn_ = 0;
  int proposals_ = 0;  // settings the optimizer proposes (the budget less the finalists')
  int warmup_left_ = 0;
  int steps_ = 0;
  int64_t step_bytes_ = 0;
  double step_seconds_ = 0.0;
  std::vector<double> samples_;
  std::vector<TunedParams> finalists_;             // being re-measured, in turn
  std::vector<std::vector<double>> finalist_scores_;
  size_t finalist_turn_ = 0;
  int discard_steps_ = 0;  // steps to ignore after a switch (they ran the previous setting)
  std::FILE* log_ = nullptr;
};

}  // namespace hvd::autotune
