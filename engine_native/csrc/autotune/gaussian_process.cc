#include "autotune/gaussian_process.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>

#include "autotune/local_search.h"

namespace hvd::autotune {

// Regression in brief: with K the kernel matrix of the training inputs plus noise on the
// diagonal and L its Cholesky factor (K = L L^T), alpha = K^-1 y is two triangular solves.
// A prediction at x with kernel vector k has mean k . alpha and variance k(x,x) - |L^-1 k|^2.
// The log marginal likelihood is -y.alpha/2 - sum(log L_ii) - n log(2 pi)/2; hyperparameters
// are searched in log space, where the likelihood surface is far better conditioned.

namespace {

constexpr double kLog2Pi = 1.8378770664093453;
constexpr double kJitter = 1e-9;
constexpr double kMinLength = 0.01, kMaxLength = 20.0;     // inputs are usually in [0, 1]
constexpr double kMinSignal = 1e-3, kMaxSignal = 1e3;
constexpr double kMinNoise = 1e-6, kMaxNoise = 2.0;

// Solves L z = b in place (forward substitution), L row-major lower triangular n x n.
void solveLower(const std::vector<double>& lower, size_t n, std::vector<double>* b) {
  for (size_t i = 0; i < n; ++i) {
    double s = (*b)[i];
    for (size_t k = 0; k < i; ++k) s -= lower[i * n + k] * (*b)[k];
    (*b)[i] = s / lower[i * n + i];
  }
}

// Solves L^T z = b in place (back substitution).
void solveUpper(const std::vector<double>& lower, size_t n, std::vector<double>* b) {
  for (size_t i = n; i-- > 0;) {
    double s = (*b)[i];
    for (size_t k = i + 1; k < n; ++k) s -= lower[k * n + i] * (*b)[k];
    (*b)[i] = s / lower[i * n + i];
  }
}

// theta = log of (length scales..., signal variance[, noise variance]).
GpHyper fromLog(const std::vector<double>& theta, size_t dims, double fixed_noise) {
  GpHyper h;
  h.length_scales.assign(theta.begin(), theta.begin() + dims);
  for (double& l : h.length_scales) l = std::exp(l);
  h.signal_variance = std::exp(theta[dims]);
  h.noise_variance = theta.size() > dims + 1 ? std::exp(theta[dims + 1]) : fixed_noise;
  return h;
}

}  // namespace

GaussianProcess::GaussianProcess(GpOptions options) : options_(options) {}

common::Status GaussianProcess::setData(const std::vector<Point>& x, const std::vector<double>& y) {
  if (x.empty() || x.size() != y.size()) {
    return common::invalidArgument("gaussian process: need as many targets as points (>= 1)");
  }
  for (const Point& p : x) {
    if (p.size() != x.front().size() || p.empty()) {
      return common::invalidArgument("gaussian process: points must share one dimension >= 1");
    }
  }
  for (double v : y) {
    if (!std::isfinite(v)) return common::invalidArgument("gaussian process: non-finite target");
  }
  x_ = x;
  const double n = static_cast<double>(y.size());
  y_mean_ = 0.0;
  for (double v : y) y_mean_ += v / n;
  double var = 0.0;
  for (double v : y) var += (v - y_mean_) * (v - y_mean_) / n;
  y_scale_ = var > 1e-300 ? std::sqrt(var) : 1.0;
  y_.resize(y.size());
  for (size_t i = 0; i < y.size(); ++i) y_[i] = (y[i] - y_mean_) / y_scale_;
  return common::Status::ok();
}

double GaussianProcess::kernel(const Point& a, const Point& b, const GpHyper& hyper) const {
  double r2 = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = (a[i] - b[i]) / hyper.length_scales[i];
    r2 += d * d;
  }
  if (options_.kernel == Kernel::kRbf) return hyper.signal_variance * std::exp(-0.5 * r2);
  const double s5r = std::sqrt(5.0 * r2);
  return hyper.signal_variance * (1.0 + s5r + 5.0 * r2 / 3.0) * std::exp(-s5r);
}

bool GaussianProcess::factorise(const GpHyper& hyper, std::vector<double>* lower) const {
  const size_t n = x_.size();
  lower->assign(n * n, 0.0);
  std::vector<double>& l = *lower;
  for (size_t i = 0; i < n; ++i) {
    for (size_t j = 0; j <= i; ++j) {
      double s = kernel(x_[i], x_[j], hyper);
      if (i == j) s += hyper.noise_variance + kJitter;
      for (size_t k = 0; k < j; ++k) s -= l[i * n + k] * l[j * n + k];
      if (i == j) {
        if (!(s > 0.0)) return false;
        l[i * n + i] = std::sqrt(s);
      } else {
        l[i * n + j] = s / l[j * n + j];
      }
    }
  }
  return true;
}

double GaussianProcess::logMarginalLikelihood(const GpHyper& hyper) const {
  const size_t n = x_.size();
  std::vector<double> lower;
  if (n == 0 || !factorise(hyper, &lower)) return -std::numeric_limits<double>::infinity();
  std::vector<double> z = y_;
  solveLower(lower, n, &z);  // z = L^-1 y, so y.alpha = |z|^2
  double fit = 0.0, logdet = 0.0;
  for (size_t i = 0; i < n; ++i) {
    fit += z[i] * z[i];
    logdet += std::log(lower[i * n + i]);
  }
  return -0.5 * fit - logdet - 0.5 * static_cast<double>(n) * kLog2Pi;
}

GpHyper GaussianProcess::searchHyper() const {
  const size_t d = x_.front().size();
  const double noise = std::min(kMaxNoise, std::max(kMinNoise, options_.noise));
  Box box;
  box.lower.assign(d, std::log(kMinLength));
  box.upper.assign(d, std::log(kMaxLength));
  box.lower.push_back(std::log(kMinSignal));
  box.upper.push_back(std::log(kMaxSignal));
  std::vector<double> start(d, std::log(0.3));
  start.push_back(0.0);
  if (options_.fit_noise) {
    box.lower.push_back(std::log(kMinNoise));
    box.upper.push_back(std::log(kMaxNoise));
    start.push_back(std::log(noise));
  }
  auto negative = [&](const std::vector<double>& theta) {
    return -logMarginalLikelihood(fromLog(theta, d, options_.noise));
  };
  std::mt19937_64 rng(options_.seed);
  LocalResult best;
  best.value = std::numeric_limits<double>::infinity();
  for (int r = 0; r < std::max(1, options_.restarts); ++r) {
    if (r > 0) {
      for (size_t i = 0; i < start.size(); ++i) {
        start[i] = std::uniform_real_distribution<double>(box.lower[i], box.upper[i])(rng);
      }
    }
    LocalResult found = minimizeInBox(negative, start, box, options_.evaluations_per_restart);
    if (found.value < best.value) best = found;
  }
  if (!std::isfinite(best.value) || best.value >= 1e300) {
    GpHyper fallback;
    fallback.length_scales.assign(d, 0.3);
    fallback.noise_variance = noise;
    return fallback;
  }
  return fromLog(best.x, d, options_.noise);
}

common::Status GaussianProcess::fit(const std::vector<Point>& x, const std::vector<double>& y) {
  HVD_RETURN_IF_ERROR(setData(x, y));
  return finish(searchHyper());
}

common::Status GaussianProcess::fitWith(const std::vector<Point>& x, const std::vector<double>& y,
                                        const GpHyper& hyper) {
  HVD_RETURN_IF_ERROR(setData(x, y));
  if (hyper.length_scales.size() != x_.front().size()) {
    return common::invalidArgument("gaussian process: one length scale per input dimension");
  }
  return finish(hyper);
}

common::Status GaussianProcess::finish(const GpHyper& hyper) {
  fitted_ = false;
  hyper_ = hyper;
  if (!factorise(hyper_, &lower_)) {
    return common::internalError("gaussian process: kernel matrix is not positive definite");
  }
  alpha_ = y_;
  solveLower(lower_, x_.size(), &alpha_);
  solveUpper(lower_, x_.size(), &alpha_);
  log_likelihood_ = logMarginalLikelihood(hyper_);
  fitted_ = true;
  return common::Status::ok();
}

void GaussianProcess::predict(const Point& x, double* mean, double* stddev) const {
  if (!fitted_) {
    *mean = 0.0;
    *stddev = 1.0;
    return;
  }
  const size_t n = x_.size();
  std::vector<double> k(n);
  double m = 0.0;
  for (size_t i = 0; i < n; ++i) {
    k[i] = kernel(x, x_[i], hyper_);
    m += k[i] * alpha_[i];
  }
  solveLower(lower_, n, &k);
  double var = hyper_.signal_variance;
  for (double v : k) var -= v * v;
  *mean = y_mean_ + y_scale_ * m;
  *stddev = y_scale_ * std::sqrt(std::max(var, 0.0));
}

}  // namespace hvd::autotune
