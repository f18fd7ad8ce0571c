"""Noise-multiplier calibration: the smallest σ (to a stated tolerance) whose composed ε meets a target.

Bisection on log σ. The invariant is ε(σ_hi) ≤ target < ε(σ_lo); the loop stops when
σ_hi/σ_lo − 1 ≤ ``rtol`` and returns σ_hi, so the returned σ always meets the target (ε is evaluated by
the same pessimistic accountant that will later report it) and is at most a factor (1 + rtol) above the
smallest σ that does. Assumes ε is non-increasing in σ, which holds for every mechanism here. With
a fine PLD grid, σ is first located on a 1e-3 grid and then re-bracketed and settled on the fine one.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from privlm.errors import UserError
from privlm.privacy.accountant import DEFAULT_DISCRETIZATION, Method, PrivacyAccountant
from privlm.privacy.events import Clipping, GaussianRelease, PoissonGaussianStep
from privlm.privacy.validation import check_count, check_delta, check_epsilon, check_noise_multiplier_for_sampler

SIGMA_RANGE = (1e-3, 1e4)
COARSE_DISCRETIZATION = 1e-3


def bisect_noise_multiplier(
    epsilon_of_sigma: Callable[[float], float],
    target_epsilon: float,
    rtol: float = 1e-3,
    start: float = 1.0,
    initial_factor: float = 2.0,
) -> float:
    """Smallest σ (within a factor 1 + ``rtol``) with ``epsilon_of_sigma(σ) <= target_epsilon``.

    Brackets from ``start`` by factors ``initial_factor``, ``initial_factor²``, … (exponential search),
    then bisects in log σ. σ is searched in [1e-3, 1e4].
    """
    check_epsilon(target_epsilon, "target epsilon")
    if not 0 < rtol < 1:
        raise UserError(f"rtol must be in (0, 1), got {rtol!r}")

    def meets(sigma: float) -> bool:
        return epsilon_of_sigma(sigma) <= target_epsilon

    factor = initial_factor
    if meets(start):
        lo, hi = start / factor, start
        while meets(lo):
            factor *= factor
            lo, hi = lo / factor, lo
            if lo < SIGMA_RANGE[0]:
                lo = SIGMA_RANGE[0]
                if meets(lo):
                    return lo
                break
    else:
        lo, hi = start, start * factor
        while not meets(hi):
            factor *= factor
            lo, hi = hi, hi * factor
            if hi > SIGMA_RANGE[1]:
                hi = SIGMA_RANGE[1]
                if not meets(hi):
                    raise UserError(f"no noise multiplier up to {hi:g} reaches epsilon {target_epsilon}")
                break
    while hi / lo - 1.0 > rtol:
        mid = math.sqrt(lo * hi)
        if meets(mid):
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
    snapped: int = 0,
) -> float:
    """ε after ``steps`` Poisson-subsampled Gaussian steps (DP-SGD) at δ (``snapped``: coordinates each
    step releases through snapping, e.g. 1 with a DP loss)."""
    check_count(steps, "steps")
    accountant = PrivacyAccountant(method, value_discretization)
    accountant.record(PoissonGaussianStep(sample_rate, noise_multiplier, clipping, probes, snapped), steps)
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
    snapped: int = 0,
) -> float:
    """Smallest σ (within 1 + ``rtol``) such that ``steps`` DP-SGD steps are (target ε, δ)-DP."""
    check_epsilon(target_epsilon, "target epsilon")
    check_delta(delta)
    check_count(steps, "steps")
    PoissonGaussianStep(sample_rate, 1.0, clipping, probes, snapped)  # validates the arguments before the search

    def epsilon_at(discretization: float) -> Callable[[float], float]:
        return lambda sigma: dpsgd_epsilon(
            sigma, sample_rate, steps, delta, clipping, probes, method, discretization, snapped
        )

    return _calibrate(epsilon_at, target_epsilon, method, rtol, value_discretization)


def gaussian_releases_epsilon(
    noise_multiplier: float,
    releases: int,
    delta: float,
    snapped: int = 0,
    value_discretization: float = DEFAULT_DISCRETIZATION,
) -> float:
    """ε (PLD, pessimistic) after ``releases`` adaptively composed Gaussian mechanisms of noise multiplier σ
    (noise std / L2 sensitivity), each snapping ``snapped`` coordinates (e.g. Private Evolution's histograms)."""
    check_count(releases, "releases")
    accountant = PrivacyAccountant("pld", value_discretization)
    accountant.record(GaussianRelease(noise_multiplier, snapped), releases)
    return accountant.epsilon(delta)


def calibrate_gaussian_releases(
    target_epsilon: float,
    delta: float,
    releases: int,
    snapped: int = 0,
    rtol: float = 1e-3,
    value_discretization: float = DEFAULT_DISCRETIZATION,
) -> float:
    """Smallest σ (within 1 + ``rtol``) such that ``releases`` Gaussian mechanisms of noise multiplier σ,
    composed (PLD, as the ledger will report them), are (target ε, δ)-DP; refuses σ below the sampler's
    floor (:func:`privlm.privacy.validation.check_noise_multiplier_for_sampler`)."""
    check_epsilon(target_epsilon, "target epsilon")
    check_delta(delta)
    check_count(releases, "releases")
    GaussianRelease(1.0, snapped)  # validates ``snapped`` before the search

    def epsilon_at(discretization: float) -> Callable[[float], float]:
        return lambda sigma: gaussian_releases_epsilon(sigma, releases, delta, snapped, discretization)

    sigma = _calibrate(epsilon_at, target_epsilon, "pld", rtol, value_discretization)
    check_noise_multiplier_for_sampler(sigma)
    return sigma


def _calibrate(
    epsilon_at: Callable[[float], Callable[[float], float]],
    target_epsilon: float,
    method: Method,
    rtol: float,
    value_discretization: float,
) -> float:
    """Bisection on ``epsilon_at(discretization)``; with a fine PLD grid, σ is first located on a coarser
    (still pessimistic) grid and then settled on the requested one."""
    if method == "pld" and value_discretization < COARSE_DISCRETIZATION:
        start = bisect_noise_multiplier(epsilon_at(COARSE_DISCRETIZATION), target_epsilon, rtol)
        return bisect_noise_multiplier(epsilon_at(value_discretization), target_epsilon, rtol, start, 1 + 4 * rtol)
    return bisect_noise_multiplier(epsilon_at(value_discretization), target_epsilon, rtol)
