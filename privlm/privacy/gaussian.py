"""Exact (ε, δ) calibration of the one-shot Gaussian mechanism (GRADMM's per-class release).

The analytic Gaussian mechanism (Balle & Wang, ICML 2018, Theorem 8): adding N(0, σ²Δ²) to a query of
L2 sensitivity Δ is (ε, δ)-DP if and only if

    δ ≥ Φ(1/(2σ) − εσ) − e^ε · Φ(−1/(2σ) − εσ).

This is tight for every ε ≥ 0 (not the classic σ ≥ √(2 ln(1.25/δ))/ε bound, which is loose and only
valid for ε < 1), and holds for add/remove and replace-one adjacency alike as long as Δ is the
sensitivity under that adjacency. The root finding is dp-accounting's; here the answer is checked
against the closed form and nudged to the safe side, so the returned σ is never too small and the
returned ε never too small.
"""

from __future__ import annotations

import math

from dp_accounting import gaussian_mechanism
from scipy.special import log_ndtr

from privlm.errors import UserError
from privlm.privacy.snapping import snapping_eta
from privlm.privacy.validation import (
    check_delta,
    check_epsilon,
    check_noise_multiplier,
    check_noise_multiplier_for_sampler,
)

_NUDGE = 1e-12


def gaussian_delta(sigma: float, epsilon: float) -> float:
    """Tight δ(ε) of the Gaussian mechanism with noise multiplier ``sigma`` (std / L2 sensitivity)."""
    check_noise_multiplier(sigma)
    if not epsilon >= 0:
        raise UserError(f"epsilon must be >= 0, got {epsilon}")
    log_a = log_ndtr(1.0 / (2.0 * sigma) - epsilon * sigma)
    log_b = epsilon + log_ndtr(-1.0 / (2.0 * sigma) - epsilon * sigma)
    if log_b >= log_a:
        return 0.0
    return float(math.exp(log_a) * -math.expm1(log_b - log_a))


def gaussian_noise_multiplier(epsilon: float, delta: float, snapped: int = 0) -> float:
    """Smallest σ (noise std / L2 sensitivity) such that one Gaussian release is (ε, δ)-DP.

    Exact (analytic Gaussian mechanism); the result satisfies ``gaussian_delta(σ, ε) <= δ``. With
    ``snapped`` coordinates released through :func:`privlm.privacy.snapping.snap`, the ideal mechanism is
    calibrated for (ε − 2η, δ·e^{−η}), η = snapped·2⁻³⁴, so that the snapped release is (ε, δ)-DP.
    Raises :class:`UserError` for ε ≤ 0 or δ ∉ (0, 1).
    """
    check_epsilon(epsilon)
    check_delta(delta)
    eta = snapping_eta(snapped)
    if epsilon <= 2 * eta:
        raise UserError(f"epsilon {epsilon} is below the snapping slack {2 * eta:.3g} of {snapped} coordinates")
    epsilon, delta = epsilon - 2 * eta, delta * math.exp(-eta)
    sigma = float(gaussian_mechanism.get_sigma_gaussian(epsilon, delta, tol=1e-12))
    while gaussian_delta(sigma, epsilon) > delta:
        sigma *= 1.0 + _NUDGE
    check_noise_multiplier_for_sampler(sigma)
    return sigma


def gaussian_epsilon(sigma: float, delta: float) -> float:
    """Smallest ε such that one Gaussian release with noise multiplier ``sigma`` is (ε, δ)-DP (exact)."""
    check_noise_multiplier(sigma)
    check_delta(delta)
    epsilon = float(gaussian_mechanism.get_epsilon_gaussian(sigma, delta, tol=1e-12))
    while gaussian_delta(sigma, epsilon) > delta:
        epsilon = epsilon * (1.0 + _NUDGE) + _NUDGE
    return epsilon
