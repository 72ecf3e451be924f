"""The autotuner's math through the test hooks (tests/native/testhooks): Gaussian-process
regression (``gp_fit_predict``, checked against scikit-learn) and the Bayesian optimizer
(``autotune_maximize``) against Python objectives."""
import math

import numpy as np
import pytest
from sklearn import gaussian_process as gp
from sklearn.gaussian_process import kernels

from native.build_testhooks import load

_hooks = load()  # the test-only extension (tests/native): built here if needed


def smooth(fusion_mb, cycle_ms):
    """A throughput-like surface on the autotuner's box: one broad peak at (20 MB, 12 ms)."""
    a, b = (fusion_mb - 20.0) / 64.0, (cycle_ms - 12.0) / 50.0
    return 5.0 - 10.0 * (a * a + 2.0 * b * b) + 0.5 * math.sin(3.0 * a)


def grid_max(f, bounds, n=201):
    xs = np.linspace(*bounds[0], n)
    ys = np.linspace(*bounds[1], n)
    return max(f(x, y) for x in xs for y in ys)


BOX = [(0.0, 64.0), (0.0, 50.0)]


# ---- Bayesian optimizer -------------------------------------------------------------------------

@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_finds_the_maximum_of_a_smooth_2d_function_within_budget(seed):
    best_x, best_y, history = _hooks.autotune_maximize(smooth, BOX, max_samples=20, noise=0.01,
                                                      seed=seed)
    top = grid_max(smooth, BOX)
    worst = grid_max(lambda x, y: -smooth(x, y), BOX) * -1
    assert len(history) == 20
    assert best_y >= top - 0.02 * (top - worst), (best_x, best_y, top)
    assert abs(best_x[0] - 20.0) < 8.0 and abs(best_x[1] - 12.0) < 6.0


def test_beats_random_search_on_average():
    rng = np.random.default_rng(0)
    top = grid_max(smooth, BOX)
    bayes, random = [], []
    for seed in range(1, 6):
        bayes.append(top - _hooks.autotune_maximize(smooth, BOX, 15, 0.01, seed)[1])
        pts = rng.uniform([0, 0], [64, 50], size=(15, 2))
        random.append(top - max(smooth(*p) for p in pts))
    assert np.mean(bayes) < np.mean(random)


def test_noisy_objective_with_default_noise():
    rng = np.random.default_rng(7)

    def noisy(x, y):
        return smooth(x, y) + rng.normal(0.0, 0.05)

    best_x, _, _ = _hooks.autotune_maximize(noisy, BOX, max_samples=25, seed=5)
    top = grid_max(smooth, BOX)
    assert smooth(*best_x) >= top - 0.1 * (top - smooth(64.0, 50.0))


def test_recommendation_discounts_a_lucky_sample():
    """One measurement far above the surface (a burst of quiet on a loaded machine) wins the
    raw maximum; the model's recommendation, which its neighbours pull down, does not lose to
    it and on average keeps a truly better setting."""
    raw_true, kept_true = [], []
    for seed in range(1, 9):
        def lucky(x, y, calls=[0]):
            calls[0] += 1
            return smooth(x, y) + (6.0 if calls[0] % 20 == 4 else 0.0)

        raw_x, _, _ = _hooks.autotune_maximize(lucky, BOX, max_samples=20, seed=seed)
        kept_x, _, _ = _hooks.autotune_maximize(lucky, BOX, max_samples=20, seed=seed,
                                               recommend=True)
        raw_true.append(smooth(*raw_x))
        kept_true.append(smooth(*kept_x))
    assert all(k >= r - 0.05 for k, r in zip(kept_true, raw_true)), (kept_true, raw_true)
    assert np.mean(kept_true) > np.mean(raw_true) + 0.1, (kept_true, raw_true)


def test_history_stays_in_bounds_and_best_is_its_maximum():
    bounds = [(-3.0, -1.0), (10.0, 20.0), (0.0, 1.0)]

    def f(a, b, c):
        return -(a + 2.0) ** 2 - ((b - 15.0) / 5.0) ** 2 - (c - 0.2) ** 2

    best_x, best_y, history = _hooks.autotune_maximize(f, bounds, max_samples=12, seed=3)
    assert len(history) == 12
    for x, y in history:
        assert len(x) == 3
        assert all(lo <= v <= hi for v, (lo, hi) in zip(x, bounds))
        assert y == pytest.approx(f(*x))
    assert best_y == max(y for _, y in history)
    assert [best_x, best_y] in [[x, y] for x, y in history]


def test_same_seed_same_history_other_seed_differs():
    one = _hooks.autotune_maximize(smooth, BOX, 8, 0.8, 11)
    two = _hooks.autotune_maximize(smooth, BOX, 8, 0.8, 11)
    three = _hooks.autotune_maximize(smooth, BOX, 8, 0.8, 12)
    assert one == two
    assert one[2] != three[2]


def test_both_kernels_work():
    for kernel in ("rbf", "matern52"):
        _, best_y, _ = _hooks.autotune_maximize(smooth, BOX, 15, 0.01, 2, kernel)
        assert best_y > 4.5


def test_objective_errors_propagate():
    def broken(x, y):
        raise RuntimeError("objective failed")

    with pytest.raises(RuntimeError, match="objective failed"):
        _hooks.autotune_maximize(broken, BOX, 5)


@pytest.mark.parametrize("bounds", [[(1.0, 1.0)], [(2.0, 1.0)], [(0.0, 1.0, 2.0)]])
def test_bad_bounds_are_value_errors(bounds):
    with pytest.raises(ValueError, match="bound"):
        _hooks.autotune_maximize(lambda *x: 0.0, bounds, 3)


def test_bad_kernel_is_a_value_error():
    with pytest.raises(ValueError, match="kernel"):
        _hooks.autotune_maximize(lambda *x: 0.0, BOX, 3, kernel="linear")


# ---- Gaussian process ----------------------------------------------------------------------------

def sine_data(n=12, seed=0):
    rng = np.random.default_rng(seed)
    x = np.sort(rng.uniform(0.0, 1.0, n))
    return x, np.sin(2.0 * math.pi * x) * 3.0 + 10.0


def test_gp_interpolates_a_smooth_function():
    x, y = sine_data()
    queries = np.linspace(0.05, 0.95, 19)
    means, _, hyper = _hooks.gp_fit_predict(x[:, None].tolist(), y.tolist(),
                                           queries[:, None].tolist(), noise=1e-6,
                                           fit_noise=False)
    truth = np.sin(2.0 * math.pi * queries) * 3.0 + 10.0
    assert np.max(np.abs(np.array(means) - truth)) < 0.3
    assert hyper["noise_variance"] == pytest.approx(1e-6)
    assert 0.02 < hyper["length_scales"][0] < 2.0


def test_gp_is_sure_at_data_and_unsure_far_away():
    x, y = sine_data()
    near, far = [[x[3]]], [[4.0]]
    (m_near,), (s_near,), _ = _hooks.gp_fit_predict(x[:, None].tolist(), y.tolist(), near,
                                                   noise=1e-6, fit_noise=False)
    (m_far,), (s_far,), _ = _hooks.gp_fit_predict(x[:, None].tolist(), y.tolist(), far,
                                                 noise=1e-6, fit_noise=False)
    assert m_near == pytest.approx(y[3], abs=1e-2)
    assert s_near < 0.05
    assert s_far > 1.0
    assert m_far == pytest.approx(np.mean(y), abs=0.5)  # reverts to the mean far from data


def test_gp_fitted_likelihood_beats_other_hyperparameters():
    x, y = sine_data(n=15, seed=2)
    xs, q = x[:, None].tolist(), [[0.5]]
    _, _, fitted = _hooks.gp_fit_predict(xs, y.tolist(), q, noise=1e-4, fit_noise=False)
    for length in (0.01, 0.05, 1.0, 5.0):
        for signal in (0.1, 1.0, 10.0):
            _, _, other = _hooks.gp_fit_predict(xs, y.tolist(), q, noise=1e-4,
                                               length_scales=[length], signal_variance=signal)
            assert fitted["log_marginal_likelihood"] >= other["log_marginal_likelihood"] - 1e-6


def test_gp_fits_the_noise_level():
    rng = np.random.default_rng(4)
    x = rng.uniform(0, 1, 40)
    y = np.sin(2 * math.pi * x) + rng.normal(0, 0.3, x.size)
    _, _, hyper = _hooks.gp_fit_predict(x[:, None].tolist(), y.tolist(), [[0.5]], noise=0.8)
    # 0.3^2 of noise over a total variance of about 0.5 + 0.09, in standardised units
    assert 0.05 < hyper["noise_variance"] < 0.4


def test_gp_rejects_bad_input():
    with pytest.raises(ValueError):
        _hooks.gp_fit_predict([], [], [[0.0]])
    with pytest.raises(ValueError):
        _hooks.gp_fit_predict([[0.0], [1.0, 2.0]], [1.0, 2.0], [[0.0]])
    with pytest.raises(ValueError):
        _hooks.gp_fit_predict([[0.0]], [1.0, 2.0], [[0.0]])
    with pytest.raises(ValueError):
        _hooks.gp_fit_predict([[0.0], [1.0]], [1.0, 2.0], [[0.0, 1.0]])


@pytest.mark.parametrize("kernel", ["rbf", "matern52"])
def test_gp_matches_scikit_learn_with_fixed_hyperparameters(kernel):
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, size=(12, 2))
    y = np.sin(4 * x[:, 0]) + x[:, 1] ** 2
    q = rng.uniform(0, 1, size=(6, 2))
    base = (kernels.RBF([0.3, 0.5]) if kernel == "rbf"
            else kernels.Matern([0.3, 0.5], nu=2.5))
    ref = gp.GaussianProcessRegressor(kernels.ConstantKernel(1.7, "fixed") * base, alpha=0.01,
                                      optimizer=None, normalize_y=True).fit(x, y)
    ref_mean, ref_std = ref.predict(q, return_std=True)
    mean, std, hyper = _hooks.gp_fit_predict(x.tolist(), y.tolist(), q.tolist(), noise=0.01,
                                            kernel=kernel, length_scales=[0.3, 0.5],
                                            signal_variance=1.7)
    np.testing.assert_allclose(mean, ref_mean, atol=1e-6)
    np.testing.assert_allclose(std, ref_std, atol=1e-6)
    assert hyper["log_marginal_likelihood"] == pytest.approx(
        ref.log_marginal_likelihood_value_, abs=1e-5)
