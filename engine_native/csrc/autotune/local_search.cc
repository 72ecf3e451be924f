#include "autotune/local_search.h"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace hvd::autotune {

// The simplex method in brief: keep d+1 points sorted by value. Each step reflects the worst
// point through the centroid of the others; if that is the new best, try going twice as far
// (expansion); if it is still the worst, try halfway back (contraction); if even that fails,
// shrink every point towards the best. Standard coefficients 1, 2, 1/2, 1/2.

std::vector<double> Box::clamp(std::vector<double> x) const {
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::min(upper[i], std::max(lower[i], x[i]));
  return x;
}

namespace {

struct Vertex {
  std::vector<double> x;
  double value;
};

std::vector<double> along(const std::vector<double>& from, const std::vector<double>& to,
                          double t) {
  std::vector<double> out(from.size());
  for (size_t i = 0; i < from.size(); ++i) out[i] = from[i] + t * (to[i] - from[i]);
  return out;
}

bool collapsed(const std::vector<Vertex>& simplex, const Box& box) {
  const double spread = simplex.back().value - simplex.front().value;
  const double scale = std::fabs(simplex.front().value) + 1e-12;
  double size = 0.0;
  for (const Vertex& v : simplex) {
    for (size_t i = 0; i < v.x.size(); ++i) {
      const double side = std::max(1e-300, box.upper[i] - box.lower[i]);
      size = std::max(size, std::fabs(v.x[i] - simplex.front().x[i]) / side);
    }
  }
  return spread <= 1e-10 * scale && size < 1e-6;
}

}  // namespace

LocalResult minimizeInBox(const Objective& f, const std::vector<double>& start, const Box& box,
                          int max_evaluations, double step_fraction) {
  const size_t d = start.size();
  int evals = 0;
  auto eval = [&](std::vector<double> x) {
    x = box.clamp(std::move(x));
    ++evals;
    double v = f(x);
    return Vertex{std::move(x), std::isfinite(v) ? v : 1e300};
  };
  std::vector<Vertex> simplex;
  simplex.push_back(eval(start));
  for (size_t i = 0; i < d; ++i) {
    std::vector<double> x = simplex.front().x;
    const double step = step_fraction * (box.upper[i] - box.lower[i]);
    x[i] = (x[i] + step <= box.upper[i]) ? x[i] + step : x[i] - step;
    simplex.push_back(eval(x));
  }
  auto byValue = [](const Vertex& a, const Vertex& b) { return a.value < b.value; };
  while (evals < max_evaluations && d > 0) {
    std::sort(simplex.begin(), simplex.end(), byValue);
    if (collapsed(simplex, box)) break;
    std::vector<double> centroid(d, 0.0);
    for (size_t k = 0; k < d; ++k) {
      for (size_t i = 0; i < d; ++i) centroid[i] += simplex[k].x[i] / static_cast<double>(d);
    }
    Vertex& worst = simplex.back();
    Vertex reflected = eval(along(worst.x, centroid, 2.0));
    if (reflected.value < simplex.front().value) {
      Vertex expanded = eval(along(worst.x, centroid, 3.0));
      worst = expanded.value < reflected.value ? expanded : reflected;
    } else if (reflected.value < simplex[d - 1].value) {
      worst = reflected;
    } else {
      const bool outside = reflected.value < worst.value;
      Vertex contracted = eval(along(worst.x, centroid, outside ? 1.5 : 0.5));
      if (contracted.value < std::min(worst.value, reflected.value)) {
        worst = contracted;
      } else {
        for (size_t k = 1; k <= d; ++k) {
          simplex[k] = eval(along(simplex.front().x, simplex[k].x, 0.5));
        }
      }
    }
  }
  const auto best = std::min_element(simplex.begin(), simplex.end(), byValue);
  return LocalResult{best->x, best->value, evals};
}

}  // namespace hvd::autotune
