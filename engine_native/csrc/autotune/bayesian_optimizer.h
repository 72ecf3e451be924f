// BayesianOptimizer: proposes where to sample a noisy black-box function next so as to find
// its maximum in few samples: a Gaussian process models the samples seen so far and the next
// point maximises expected improvement (xi = 0.01) over the box. Inputs are normalised to the
// unit cube internally. Pure; ParameterManager drives it on the background thread of rank 0.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

#include "autotune/gaussian_process.h"

namespace hvd::autotune {

struct BayesOptions {
  double noise = 0.8;          // GP noise variance on standardised scores (starting guess)
  bool fit_noise = true;       // false: keep `noise` fixed
  double xi = 0.01;            // exploration margin of expected improvement
  Kernel kernel = Kernel::kMatern52;
  int random_candidates = 2000;  // acquisition: random points scored first ...
  int local_starts = 5;          // ... then the best few refined by local search
  int gp_restarts = 5;
  int initial_points = -1;       // space-filling random points before the model is used;
                                 // -1: 2 * dimensions + 1
  uint64_t seed = 1;
};

class BayesianOptimizer {
 public:
  // lower[i] < upper[i] bound dimension i (original units).
  BayesianOptimizer(std::vector<double> lower, std::vector<double> upper,
                    BayesOptions options = BayesOptions());

  void addSample(const Point& x, double y);  // x in original units, clamped into the box
  // Next point to evaluate (original units): a stratified random design while fewer than
  // initial_points samples are known, else the maximiser of expected improvement under the
  // refitted model.
  Point nextSample();

  size_t size() const { return xs_.size(); }
  bool best(Point* x, double* y) const;  // false when empty
  // The sample to keep when sampling ends: the one whose posterior mean (the model refitted on
  // every sample) is highest, which discounts a lucky measurement that its neighbours
  // contradict. Index into the samples in the order added; -1 when empty.
  int recommend();
  // Posterior mean at every sample (model refitted on all), in the order added; the samples
  // themselves while fewer than three are known or the fit fails.
  std::vector<double> posteriorMeans();
  // Expected improvement at x (original units) under the last fitted model.
  double expectedImprovement(const Point& x) const;
  const GaussianProcess& model() const { return gp_; }

 private:
  Point toUnit(const Point& x) const;
  Point fromUnit(const Point& u) const;
  Point randomUnit();
  Point initialDesignPoint();
  double expectedImprovementUnit(const Point& u) const;
  bool nearSample(const Point& u) const;

  std::vector<double> lower_, upper_;
  BayesOptions options_;
  std::mt19937_64 rng_;
  GaussianProcess gp_;
  std::vector<Point> xs_;  // unit cube
  std::vector<double> ys_;
  double best_y_ = 0.0;
  std::vector<std::vector<int>> strata_;  // per dimension, a shuffled order of the strata
};

}  // namespace hvd::autotune
