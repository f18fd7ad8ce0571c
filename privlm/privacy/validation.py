"""Range checks shared by the privacy layer: every bad value becomes a :class:`UserError` naming it."""

from __future__ import annotations

import math

from privlm.errors import UserError


def check_epsilon(epsilon: float, name: str = "epsilon") -> float:
    """ε must be a positive finite number."""
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise UserError(f"{name} must be a positive finite number, got {epsilon!r}")
    return float(epsilon)


def check_delta(delta: float, name: str = "delta") -> float:
    """δ must lie in the open interval (0, 1)."""
    if not (isinstance(delta, (int, float)) and 0.0 < delta < 1.0):
        raise UserError(f"{name} must be in (0, 1), got {delta!r}")
    return float(delta)


def check_noise_multiplier(sigma: float, name: str = "noise multiplier") -> float:
    """σ (noise std / L2 sensitivity) must be a positive finite number."""
    if not (isinstance(sigma, (int, float)) and math.isfinite(sigma) and sigma > 0):
        raise UserError(f"{name} must be a positive finite number, got {sigma!r}")
    return float(sigma)


def check_sample_rate(q: float, name: str = "sample rate") -> float:
    """The Poisson sampling rate q must lie in (0, 1]."""
    if not (isinstance(q, (int, float)) and 0.0 < q <= 1.0):
        raise UserError(f"{name} must be in (0, 1], got {q!r}")
    return float(q)


def check_count(count: int, name: str = "steps") -> int:
    """A number of repetitions must be an integer >= 1."""
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise UserError(f"{name} must be an integer >= 1, got {count!r}")
    return count


Z_MAX = math.sqrt(2 * 106 * math.log(2))  # the largest |z| privlm's Gaussian sampler returns (u₁ ≥ 2⁻¹⁰⁶)
MIN_NOISE_MULTIPLIER = 0.2  # P(Z > Z_MAX − 1/σ) ≤ 10⁻¹² above it


def check_noise_multiplier_for_sampler(noise_multiplier: float) -> None:
    """Refuse 0 < σ < :data:`MIN_NOISE_MULTIPLIER`: there the truncation of :mod:`privlm.randomness`'s
    sampler at :data:`Z_MAX` would add more than 10⁻¹² to δ per release (σ = 0, noise off, is not a
    private mechanism and is allowed)."""
    if 0 < noise_multiplier < MIN_NOISE_MULTIPLIER:
        raise UserError(
            f"noise multiplier {noise_multiplier:.4g} is below {MIN_NOISE_MULTIPLIER}: the Gaussian sampler's tail "
            f"(|z| ≤ {Z_MAX:.2f}) no longer covers the sensitivity; ε this large is not supported"
        )
