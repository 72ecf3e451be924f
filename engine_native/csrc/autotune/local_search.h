// minimizeInBox: derivative-free local minimisation (Nelder-Mead on a simplex) of a function
// over a box. Shared by the Gaussian process (fitting hyperparameters) and the Bayesian
// optimizer (maximising expected improvement). Pure; runs on the caller's thread.
#pragma once

#include <functional>
#include <vector>

namespace hvd::autotune {

struct Box {
  std::vector<double> lower;
  std::vector<double> upper;
  std::vector<double> clamp(std::vector<double> x) const;
};

struct LocalResult {
  std::vector<double> x;
  double value = 0.0;
  int evaluations = 0;
};

using Objective = std::function<double(const std::vector<double>&)>;

// Starts from `start` (clamped into the box) with a simplex whose edges are step_fraction of
// each side; stops after max_evaluations or when the simplex has collapsed. Points are
// clamped into the box before evaluation, so f is only ever called inside it.
LocalResult minimizeInBox(const Objective& f, const std::vector<double>& start, const Box& box,
                          int max_evaluations, double step_fraction = 0.15);

}  // namespace hvd::autotune
