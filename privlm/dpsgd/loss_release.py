"""A DP training loss, released by the same Gaussian mechanism as the gradient.

Per logical step the mechanism releases the joint vector

    (Σ_i c_i g_i ,  α·(C/L)·Σ_i clamp(ℓ_i, 0, L))  +  N(0, σ²C² I)

with per-sample losses ℓ_i, loss bound L (``bound``) and loss noise fraction α (``fraction``), both
public. Under add/remove-one adjacency the gradient part moves by ≤ C (exact clipping) and the loss
part by ≤ α·C, so the joint sensitivity is ≤ C·√(1+α²); the step is a Poisson-subsampled Gaussian
with noise multiplier σ_eff = σ/√(1+α²). With randomized clipping the gradient part moves by
C·s(X), s ≥ 1, and √(s²+α²) ≤ s·√(1+α²), so accounting the step as randomized clipping at σ_eff
(same probes) dominates it too. Dividing the loss coordinate by α·C/L and by the expected batch
size q·N gives the released loss

    (Σ_i clamp(ℓ_i, 0, L) + N(0, σ²L²/α²)) / (q·N),

an unbiased estimate of the clamped mean loss of the step (post-processing of the accounted release).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from privlm.errors import UserError


@dataclass(frozen=True)
class LossRelease:
    """Release a DP training loss with every step: losses clamped to [0, ``bound``] (nats; the default
    10 suits *mean* token losses — ln of a 50k vocabulary is 10.8 — not sum-reduced ones), and the loss
    coordinate scaled by ``fraction`` = α before the shared noise (larger α: less loss noise, more ε)."""

    bound: float = 10.0
    fraction: float = 0.2

    def __post_init__(self) -> None:
        if not (math.isfinite(self.bound) and self.bound > 0):
            raise UserError(f"loss bound must be a finite number > 0, got {self.bound!r}")
        if not (math.isfinite(self.fraction) and self.fraction > 0):
            raise UserError(
                f"loss noise fraction must be a finite number > 0 (0, or no release, releases no loss), got {self.fraction!r}"
            )

    @classmethod
    def optional(cls, bound: float, fraction: float) -> LossRelease | None:
        """The release for settings where ``fraction == 0`` means "release no loss" (None); a negative or
        otherwise invalid setting is a :class:`UserError`."""
        return None if fraction == 0 else cls(bound, fraction)

    @property
    def sensitivity_factor(self) -> float:
        """√(1+α²): the joint vector's sensitivity in units of C."""
        return math.sqrt(1 + self.fraction**2)

    def effective_multiplier(self, noise_multiplier: float) -> float:
        """σ_eff = σ/√(1+α²), the multiplier the accountant records for noise σ."""
        return noise_multiplier / self.sensitivity_factor

    def noise_multiplier(self, effective_multiplier: float) -> float:
        """σ = σ_eff·√(1+α²), the noise to draw for an accounted (calibrated) σ_eff."""
        return effective_multiplier * self.sensitivity_factor

    def loss_noise_std(self, noise_multiplier: float) -> float:
        """Std σL/α of the noise on the released loss *sum* (before dividing by q·N)."""
        return noise_multiplier * self.bound / self.fraction
