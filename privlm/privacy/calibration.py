"""Noise-multiplier calibration: the smallest σ (to a stated tolerance) whose composed ε meets a target.

Bisection on log σ. The invariant is ε(σ_hi) ≤ target < ε(σ_lo); the loop stops when
σ_hi/σ_lo − 1 ≤ ``rtol`` and returns σ_hi, so the returned σ always meets the target (ε is evaluated by
the same pessimistic accountant that will later report it) and is at most a factor (1 + rtol) above the
smallest σ that does. Assumes ε is non-increasing in σ, which holds for every mechanism here.
"""

from __future__ import annotations

import math
from typing import Callable

from privlm.errors import UserError
from privlm.privacy.accountant import DEFAULT_DISCRETIZATION, Method, PrivacyAccountant
from privlm.privacy.events import Clipping, PoissonGaussianStep
from privlm.privacy.validation import check_count, check_delta, check_epsilon

SIGMA_RANGE = (1e-3, 1e4)


def bisect_noise_multiplier(
    epsilon_of_sigma: Callable[[float], float], target_epsilon: float, rtol: float = 1e-3
) -> float:
    """Smallest σ (within a factor 1 + ``rtol``) with ``epsilon_of_sigma(σ) <= target_epsilon``."""
    check_epsilon(target_epsilon, "target epsilon")
    if not 0 < rtol < 1:
        raise UserError(f"rtol must be in (0, 1), got {rtol!r}")
    if epsilon_of_sigma(1.0) <= target_epsilon:
        lo, hi = 0.5, 1.0
        while epsilon_of_sigma(lo) <= target_epsilon:
            lo, hi = lo / 2.0, lo
            if lo < SIGMA_RANGE[0]:
                return hi
    else:
        lo, hi = 1.0, 2.0
        while epsilon_of_sigma(hi) > target_epsilon:
            lo, hi = hi, hi * 2.0
            if hi > SIGMA_RANGE[1]:
                raise UserError(f"no noise multiplier up to {SIGMA_RANGE[1]:g} reaches epsilon {target_epsilon}")
    while hi / lo - 1.0 > rtol:
        mid = math.sqrt(lo * hi)
        if epsilon_of_sigma(mid) <= target_epsilon:
            hi = mid
        else:
            lo = mid
    return hi


def dpsgd_epsilon(
    noise_multiplier: float,
    sample_rate: float,
    steps: int,
    delta: float,
    clipping: Clipping = "exact",
    probes: int | None = None,
    method: Method = "pld",
    value_discretization: float = DEFAULT_DISCRETIZATION,
) -> float:
    """ε after ``steps`` Poisson-subsampled Gaussian steps (DP-SGD) at δ."""
    check_count(steps, "steps")
    accountant = PrivacyAccountant(method, value_discretization)
    accountant.record(PoissonGaussianStep(sample_rate, noise_multiplier, clipping, probes), steps)
    return accountant.epsilon(delta)


def calibrate_noise_multiplier(
    target_epsilon: float,
    delta: float,
    sample_rate: float,
    steps: int,
    clipping: Clipping = "exact",
    probes: int | None = None,
    method: Method = "pld",
    rtol: float = 1e-3,
    value_discretization: float = DEFAULT_DISCRETIZATION,
) -> float:
    """Smallest σ (within 1 + ``rtol``) such that ``steps`` DP-SGD steps are (target ε, δ)-DP."""
    check_epsilon(target_epsilon, "target epsilon")
    check_delta(delta)
    check_count(steps, "steps")
    PoissonGaussianStep(sample_rate, 1.0, clipping, probes)  # validates the arguments before the search

    def epsilon_of_sigma(sigma: float) -> float:
        return dpsgd_epsilon(sigma, sample_rate, steps, delta, clipping, probes, method, value_discretization)

    return bisect_noise_multiplier(epsilon_of_sigma, target_epsilon, rtol)
