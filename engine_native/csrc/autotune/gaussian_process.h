// GaussianProcess: Gaussian-process regression for the autotuner. Owns its training data,
// a fitted kernel (RBF or Matern 5/2 with one length scale per input) and the Cholesky factor
// used to predict. Hyperparameters (length scales, signal and noise variance) maximise the log
// marginal likelihood (several starts). Pure; used by BayesianOptimizer on the caller's thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace hvd::autotune {

using Point = std::vector<double>;

enum class Kernel { kRbf, kMatern52 };

struct GpOptions {
  Kernel kernel = Kernel::kMatern52;
  double noise = 0.8;        // noise variance on the diagonal, standardised-target units:
  bool fit_noise = true;     // the starting guess when fitted, else fixed
  int restarts = 5;          // likelihood searches: one from a default guess, the rest random
  int evaluations_per_restart = 200;
  uint64_t seed = 1;
};

struct GpHyper {
  std::vector<double> length_scales;  // one per input dimension
  double signal_variance = 1.0;       // of the standardised targets
  double noise_variance = 0.8;
};

class GaussianProcess {
 public:
  explicit GaussianProcess(GpOptions options = GpOptions());

  // Standardises y, fits the hyperparameters, factorises. Needs at least one point; every
  // point must have the same dimension. Returns InvalidArgument on bad input.
  common::Status fit(const std::vector<Point>& x, const std::vector<double>& y);
  // The same with given hyperparameters (no search).
  common::Status fitWith(const std::vector<Point>& x, const std::vector<double>& y,
                         const GpHyper& hyper);

  // Posterior mean and standard deviation of the latent function at x, in y's units.
  void predict(const Point& x, double* mean, double* stddev) const;

  // Log marginal likelihood of the standardised targets under `hyper` (-inf if singular).
  double logMarginalLikelihood(const GpHyper& hyper) const;
  double logMarginalLikelihood() const { return log_likelihood_; }

  const GpHyper& hyper() const { return hyper_; }
  double targetScale() const { return y_scale_; }  // y = mean + scale * standardised y
  size_t size() const { return x_.size(); }
  bool fitted() const { return fitted_; }

 private:
  common::Status setData(const std::vector<Point>& x, const std::vector<double>& y);
  double kernel(const Point& a, const Point& b, const GpHyper& hyper) const;
  // Cholesky factor of K + noise I into *lower (row-major n x n); false if not positive.
  bool factorise(const GpHyper& hyper, std::vector<double>* lower) const;
  GpHyper searchHyper() const;
  common::Status finish(const GpHyper& hyper);  // factorise the stored data with hyper

  GpOptions options_;
  std::vector<Point> x_;
  std::vector<double> y_;  // standardised
  double y_mean_ = 0.0;
  double y_scale_ = 1.0;
  GpHyper hyper_;
  std::vector<double> lower_;  // Cholesky factor
  std::vector<double> alpha_;  // (K + noise I)^-1 y
  double log_likelihood_ = 0.0;
  bool fitted_ = false;
};

}  // namespace hvd::autotune
