"""Randomized-clipping accounting: closed forms against dp-accounting, the mixture PLD against an
independent mixture of dp-accounting PLDs and against numerical integration, and the sanity laws."""

from __future__ import annotations

import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_mechanism import AdjacencyType, GaussianPrivacyLoss
from scipy import integrate
from scipy.stats import chi2

from privlm.privacy.accountant import PrivacyAccountant
from privlm.privacy.calibration import dpsgd_epsilon
from privlm.privacy.envelope import sensitivity_survival
from privlm.privacy.events import PoissonGaussianStep
from privlm.privacy.randomized import (
    COARSE_RATIO,
    FINE_MASS,
    MAX_RATIO,
    SensitivityGrid,
    mixture_pld,
    randomized_clipping_pld,
    sensitivity_grid,
    subsampled_gaussian_delta,
)

STEP = 1e-3
ADJACENCY = {"remove": AdjacencyType.REMOVE, "add": AdjacencyType.ADD}


@pytest.mark.parametrize("adjacency", ["remove", "add"])
@pytest.mark.parametrize("q, s, sigma", [(0.01, 1.0, 1.0), (0.3, 2.5, 1.7), (1.0, 0.6, 0.9), (0.05, 7.0, 0.8)])
def test_closed_form_curve_matches_dp_accounting(adjacency: str, q: float, s: float, sigma: float) -> None:
    eps = np.linspace(-3.0, 8.0, 45)
    reference = GaussianPrivacyLoss(
        sigma, sensitivity=s, sampling_prob=q, adjacency_type=ADJACENCY[adjacency]
    ).get_delta_for_epsilon(eps)
    ours = subsampled_gaussian_delta(eps, s, sigma, q, adjacency)
    np.testing.assert_allclose(ours, reference, rtol=1e-7, atol=1e-14)


@pytest.mark.parametrize("k, sigma", [(4, 0.7), (32, 1.0), (1024, 2.0)])
def test_grid_is_a_probability_distribution(k: int, sigma: float) -> None:
    grid = sensitivity_grid(k, sigma)
    total = grid.probabilities.sum() + grid.tail_probability
    assert total == pytest.approx(1.0, abs=1e-12)
    assert grid.sensitivities[0] == 1.0 and np.all(np.diff(grid.sensitivities) > 0)
    assert grid.probabilities[0] == pytest.approx(chi2.sf(k, k))  # the atom X >= 1 (no discount)
    ratios = grid.sensitivities[1:] / grid.sensitivities[:-1]
    beyond_fine = sensitivity_survival(grid.sensitivities[:-1], k) < FINE_MASS * (1 + 1e-9)
    assert np.all(ratios[~beyond_fine] <= MAX_RATIO + 1e-12) and np.all(ratios <= COARSE_RATIO + 1e-12)
    assert grid.tail_probability <= 1e-15 * (1 + 1e-9) or grid.sensitivities[-1] == pytest.approx(12.0 * sigma)


def test_degenerate_mixture_equals_exact_subsampled_gaussian() -> None:
    """With all mass at sensitivity 1 the mixture is DP-SGD with exact clipping."""
    grid = SensitivityGrid(np.array([1.0]), np.array([1.0]), 0.0)
    ours = mixture_pld(grid, 0.04, 1.5, STEP).self_compose(500)
    reference = pld_lib.from_gaussian_mechanism(1.5, sampling_prob=0.04, value_discretization_interval=STEP)
    reference = reference.self_compose(500)
    for delta in (1e-5, 1e-8):
        assert ours.get_epsilon_for_delta(delta) == pytest.approx(reference.get_epsilon_for_delta(delta), rel=2e-3)


def test_mixture_matches_mixture_of_dp_accounting_plds() -> None:
    """Independent reference: dp-accounting's own PLDs mixed with compute_mixture, plus the
    infinite-sensitivity pair written by hand (remove: +∞ w.p. q, ln(1−q) otherwise; add: −ln(1−q))."""
    q, sigma = 0.05, 1.2
    sens, probs, tail = np.array([1.0, 1.4, 2.5]), np.array([0.6, 0.3, 0.0999]), 1e-4
    ours = mixture_pld(SensitivityGrid(sens, probs, tail), q, sigma, STEP)

    def component(s: float) -> pld_lib.PrivacyLossDistribution:
        return pld_lib.from_gaussian_mechanism(
            sigma, sensitivity=s, sampling_prob=q, value_discretization_interval=STEP
        )

    infinite = pld_lib.PrivacyLossDistribution.create_from_rounded_probability(
        {math.ceil(math.log1p(-q) / STEP): 1 - q},
        q,
        STEP,
        symmetric=False,
        rounded_probability_mass_function_add={math.ceil(-math.log1p(-q) / STEP): 1.0},
        infinity_mass_add=0.0,
    )
    reference, weight = infinite, tail
    for s, p in zip(sens[::-1], probs[::-1]):
        weight += p
        reference = component(s).compute_mixture(reference, p / weight)
    eps = np.array([0.0, 0.2, 0.5, 1.0, 2.0])
    np.testing.assert_allclose(ours.get_delta_for_epsilon(eps), reference.get_delta_for_epsilon(eps), rtol=2e-3)
    ours_t, reference_t = ours.self_compose(200), reference.self_compose(200)
    assert ours_t.get_epsilon_for_delta(1e-6) == pytest.approx(reference_t.get_epsilon_for_delta(1e-6), rel=2e-3)


def _integrated_delta(eps: float, q: float, sigma: float, k: int) -> float:
    """E_S[δ_S(ε)] over the envelope law of S by adaptive quadrature, worse of both adjacencies.

    δ_s is the closed form checked against dp-accounting above; nothing of the binning is used."""
    worst = 0.0
    for adjacency in ADJACENCY:

        def delta_s(s: float, adjacency: str = adjacency) -> float:
            return float(subsampled_gaussian_delta(np.array([eps]), s, sigma, q, adjacency)[0])

        atom = chi2.sf(k, k) * delta_s(1.0)
        body, _ = integrate.quad(
            lambda x: delta_s(x**-0.5) * k * chi2.pdf(k * x, k), 0.0, 1.0, limit=200, epsabs=1e-15, epsrel=1e-9
        )
        worst = max(worst, atom + body)
    return worst


@pytest.mark.parametrize("q, sigma, k", [(0.01, 1.0, 32), (0.1, 2.0, 8), (1.0, 3.0, 16)])
def test_single_step_curve_is_a_tight_upper_bound(q: float, sigma: float, k: int) -> None:
    pld = randomized_clipping_pld(q, sigma, k, STEP)
    for eps in (0.1, 0.5, 1.0):
        truth = _integrated_delta(eps, q, sigma, k)
        ours = pld.get_delta_for_epsilon(eps)
        assert truth * (1 - 1e-6) <= ours <= truth * 1.10


@pytest.mark.parametrize("sigma, q, steps", [(1.0, 0.01, 1000), (2.0, 0.05, 300), (0.8, 0.002, 2000)])
def test_randomized_costs_more_than_exact(sigma: float, q: float, steps: int) -> None:
    exact = dpsgd_epsilon(sigma, q, steps, 1e-5, value_discretization=STEP)
    for clipping, probes in (("hutchinson", 32), ("hutchpp", 96), ("hutchinson", 512)):
        assert dpsgd_epsilon(sigma, q, steps, 1e-5, clipping, probes, value_discretization=STEP) > exact


def test_randomized_epsilon_decreases_to_exact_as_probes_grow() -> None:
    sigma, q, steps, delta = 1.5, 0.02, 1000, 1e-5
    exact = dpsgd_epsilon(sigma, q, steps, delta, value_discretization=STEP)
    series = [
        dpsgd_epsilon(sigma, q, steps, delta, "hutchinson", k, value_discretization=STEP) for k in (8, 32, 128, 1024)
    ]
    assert all(a > b for a, b in zip(series, series[1:])), series
    assert series[-1] > exact
    assert series[-1] == pytest.approx(exact, rel=0.03), (series, exact)


def test_hutchpp_is_accounted_as_hutchinson_with_a_third_of_the_probes() -> None:
    a = dpsgd_epsilon(1.1, 0.02, 200, 1e-5, "hutchpp", 98, value_discretization=STEP)
    b = dpsgd_epsilon(1.1, 0.02, 200, 1e-5, "hutchinson", 32, value_discretization=STEP)
    assert a == b


def test_mixed_exact_and_randomized_compose() -> None:
    accountant = PrivacyAccountant(value_discretization=STEP)
    accountant.record(PoissonGaussianStep(0.02, 1.0), 100)
    alone = accountant.epsilon(1e-5)
    accountant.record(PoissonGaussianStep(0.02, 1.0, "hutchinson", 64), 100)
    assert accountant.epsilon(1e-5) > alone


def test_infinite_loss_mass_is_negligible_over_many_steps() -> None:
    """The mass given infinite loss (sensitivity beyond the grid, tails) stays far below any δ of interest:
    after 10,000 steps at k = 32 the composed δ at ε = 100 (≈ the infinite-loss mass) is below 1e-10."""
    pld = randomized_clipping_pld(0.01, 1.0, 32, STEP)
    assert pld.get_delta_for_epsilon(100.0) <= 0.01 * 1e-15 + 2e-16
    assert pld.self_compose(10_000).get_delta_for_epsilon(100.0) <= 1e-10
