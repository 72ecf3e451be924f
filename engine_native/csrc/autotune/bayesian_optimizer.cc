#include "autotune/bayesian_optimizer.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "autotune/local_search.h"

namespace hvd::autotune {

// Expected improvement in brief: with the model's mean m and deviation s at a point, best the
// largest sample so far, and everything measured in standardised units, the improvement we
// expect over best + xi is EI = (m - best - xi) Phi(z) + s phi(z), z = (m - best - xi) / s.
// It is large where the mean is high (exploitation) or the model is unsure (exploration).

namespace {

constexpr double kInvSqrt2Pi = 0.3989422804014327;
constexpr int kLocalEvaluations = 120;

}  // namespace

BayesianOptimizer::BayesianOptimizer(std::vector<double> lower, std::vector<double> upper,
                                     BayesOptions options)
    : lower_(std::move(lower)),
      upper_(std::move(upper)),
      options_(options),
      rng_(options.seed),
      gp_([&] {
        GpOptions gp;
        gp.kernel = options.kernel;
        gp.noise = options.noise;
        gp.fit_noise = options.fit_noise;
        gp.restarts = options.gp_restarts;
        gp.seed = options.seed ^ 0x9e3779b97f4a7c15ull;
        return gp;
      }()) {}

Point BayesianOptimizer::toUnit(const Point& x) const {
  Point u(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    const double side = upper_[i] - lower_[i];
    u[i] = side > 0 ? std::min(1.0, std::max(0.0, (x[i] - lower_[i]) / side)) : 0.0;
  }
  return u;
}

Point BayesianOptimizer::fromUnit(const Point& u) const {
  Point x(u.size());
  for (size_t i = 0; i < u.size(); ++i) x[i] = lower_[i] + u[i] * (upper_[i] - lower_[i]);
  return x;
}

Point BayesianOptimizer::randomUnit() {
  Point u(lower_.size());
  for (double& v : u) v = std::uniform_real_distribution<double>(0.0, 1.0)(rng_);
  return u;
}

// Latin-hypercube style: the k-th initial point lies in stratum strata_[i][k] of dimension i,
// so the first points cover every dimension evenly before the model takes over.
Point BayesianOptimizer::initialDesignPoint() {
  const size_t n = static_cast<size_t>(
      options_.initial_points >= 0 ? options_.initial_points : 2 * lower_.size() + 1);
  if (strata_.empty()) {
    strata_.assign(lower_.size(), std::vector<int>(n));
    for (auto& order : strata_) {
      for (size_t k = 0; k < n; ++k) order[k] = static_cast<int>(k);
      std::shuffle(order.begin(), order.end(), rng_);
    }
  }
  const size_t k = xs_.size() % std::max<size_t>(n, 1);
  Point u = randomUnit();
  for (size_t i = 0; i < u.size(); ++i) {
    u[i] = (strata_[i][k] + u[i]) / static_cast<double>(n);
  }
  return u;
}

void BayesianOptimizer::addSample(const Point& x, double y) {
  xs_.push_back(toUnit(x));
  ys_.push_back(y);
  if (ys_.size() == 1 || y > best_y_) best_y_ = y;
}

bool BayesianOptimizer::best(Point* x, double* y) const {
  if (ys_.empty()) return false;
  const size_t i = std::max_element(ys_.begin(), ys_.end()) - ys_.begin();
  *x = fromUnit(xs_[i]);
  *y = ys_[i];
  return true;
}

std::vector<double> BayesianOptimizer::posteriorMeans() {
  if (ys_.size() < 3 || !gp_.fit(xs_, ys_).isOk()) return ys_;
  std::vector<double> means(xs_.size());
  for (size_t i = 0; i < xs_.size(); ++i) {
    double sd = 0.0;
    gp_.predict(xs_[i], &means[i], &sd);
  }
  return means;
}

int BayesianOptimizer::recommend() {
  if (ys_.empty()) return -1;
  const std::vector<double> means = posteriorMeans();
  return static_cast<int>(std::max_element(means.begin(), means.end()) - means.begin());
}

double BayesianOptimizer::expectedImprovementUnit(const Point& u) const {
  double mean = 0.0, sd = 0.0;
  gp_.predict(u, &mean, &sd);
  const double scale = gp_.targetScale();
  const double gain = (mean - best_y_) / scale - options_.xi;
  const double s = sd / scale;
  if (s < 1e-12) return std::max(gain, 0.0);
  const double z = gain / s;
  const double cdf = 0.5 * std::erfc(-z / std::sqrt(2.0));
  const double pdf = kInvSqrt2Pi * std::exp(-0.5 * z * z);
  return gain * cdf + s * pdf;
}

double BayesianOptimizer::expectedImprovement(const Point& x) const {
  return gp_.fitted() ? expectedImprovementUnit(toUnit(x)) : 0.0;
}

bool BayesianOptimizer::nearSample(const Point& u) const {
  for (const Point& s : xs_) {
    double d2 = 0.0;
    for (size_t i = 0; i < u.size(); ++i) d2 += (u[i] - s[i]) * (u[i] - s[i]);
    if (d2 < 1e-12) return true;
  }
  return false;
}

Point BayesianOptimizer::nextSample() {
  const size_t initial = static_cast<size_t>(
      options_.initial_points >= 0 ? options_.initial_points : 2 * lower_.size() + 1);
  if (xs_.size() < std::max<size_t>(initial, 2)) {
    return fromUnit(xs_.size() < initial ? initialDesignPoint() : randomUnit());
  }
  if (!gp_.fit(xs_, ys_).isOk()) return fromUnit(randomUnit());
  // Score random candidates, then refine the best few by local search on -EI.
  std::vector<std::pair<double, Point>> scored;
  scored.reserve(options_.random_candidates);
  for (int i = 0; i < std::max(1, options_.random_candidates); ++i) {
    Point u = randomUnit();
    scored.emplace_back(expectedImprovementUnit(u), std::move(u));
  }
  const size_t starts = std::min<size_t>(std::max(1, options_.local_starts), scored.size());
  std::partial_sort(scored.begin(), scored.begin() + starts, scored.end(),
                    [](const auto& a, const auto& b) { return a.first > b.first; });
  Box unit{std::vector<double>(lower_.size(), 0.0), std::vector<double>(lower_.size(), 1.0)};
  auto negative = [this](const Point& u) { return -expectedImprovementUnit(u); };
  Point chosen = scored.front().second;
  double chosen_ei = scored.front().first;
  for (size_t i = 0; i < starts; ++i) {
    LocalResult r = minimizeInBox(negative, scored[i].second, unit, kLocalEvaluations, 0.05);
    if (-r.value > chosen_ei) {
      chosen_ei = -r.value;
      chosen = r.x;
    }
  }
  // A flat acquisition (everything known) or a repeat teaches nothing: explore instead.
  if (!(chosen_ei > 0.0) || nearSample(chosen)) chosen = randomUnit();
  return fromUnit(chosen);
}

}  // namespace hvd::autotune
