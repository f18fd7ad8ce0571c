"""Snapping: released noisy values on a coarse power-of-two grid, so their low-order bits carry nothing.

Floating-point attacks on noise addition (Mironov 2012; Haney et al. 2022 for Gaussians) read the
*exact* float a mechanism outputs: when y = fl(x + noise) nearly cancels x, y − x is exact and must be a
representable noise value, so some outputs are possible under x and impossible under x′ (measured on
privlm before snapping: 2.2 % of float32 GRADMM coordinates with σC = 1, x = 3 vs 2.5; 5 % of float64
DP-loss releases). :func:`snap` releases instead

    y = Λ · round(clamp(fl64(x + noise), −B, B) / Λ),   Λ = 2^(⌊log₂ s⌋ − 8),   B = 2^(⌊log₂ s⌋ + 8),

for noise standard deviation s (so s/512 < Λ ≤ s/256 and 256·s/2 < B ≤ 256·s), computed in float64 and
exact in float32 too (|y|/Λ ≤ 2¹⁶). Every grid cell is Λ wide and holds ≈ 2⁴⁰ attainable float64 sums
under x and under x′, so which cell the sum falls in is the information released, as for an ideal
real-valued Gaussian mechanism followed by rounding (post-processing). Clamping at B (256 noise
standard deviations) is post-processing too; a coordinate whose signal exceeds it is cut.

What remains (the stated assumption): the float64 sum may land in the neighbouring cell when the exact
sum lies within one float64 ulp of a cell edge. That ulp is at most ulp(B) = 2⁻³⁶·Λ (plus 2⁻⁴⁰·Λ for the
rounding of σC·z), and within the ≈ 17 noise standard deviations where either hypothesis has mass
(σ ≥ 0.2: :mod:`privlm.randomness`) the density changes by < 7 % across a cell, so each cell's
probability is within a factor e^{±η}, η = 2⁻³⁴, of the ideal mechanism's, per coordinate. For d
snapped coordinates that turns an (ε, δ) guarantee of the ideal mechanism into (ε + 2dη, e^{dη}·δ)
(:func:`snapped_guarantee`): 2dη = 7·10⁻⁸ for GRADMM's label-row release (d = K·576), 0.0066 for its
full-head release of SmolLM2 (d = 2·28.3M), 10⁻¹⁰ per DP-loss release. The accountant adds it to every
event that says how many coordinates it snapped (``snapped``), so the reported ε includes it. The float64
Gaussian sampler itself is taken as exact at this resolution (:mod:`privlm.randomness`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

GRID_BITS = 8  # Λ ≈ s/2⁸: rounding adds noise of std ≤ s/887, a 6·10⁻⁷ relative change of the variance
CLAMP_BITS = 8  # B ≈ 2⁸·s
MAX_CLAMP_BITS = 16  # |y|/Λ ≤ 2^(GRID_BITS + 16) = 2²⁴: still exact in float32
LOG_RATIO_PER_COORDINATE = 2.0**-34  # η: |ln(P_snapped(cell) / P_ideal(cell))| per coordinate


def grid(noise_std: float, clamp_bits: int = CLAMP_BITS) -> tuple[float, float]:
    """(Λ, B) for noise standard deviation ``noise_std`` > 0 (module docstring); ``B = 2^(⌊log₂ s⌋ + clamp_bits)``.

    A wider clamp (``clamp_bits`` > :data:`CLAMP_BITS`, at most 16 so that |y|/Λ ≤ 2²⁴ stays exact in
    float32) cuts fewer large signals but costs more slack: see :func:`snapped_coordinates`."""
    if not noise_std > 0 or not math.isfinite(noise_std):
        raise ValueError(f"snapping needs a positive, finite noise std, got {noise_std}")
    if not CLAMP_BITS <= clamp_bits <= MAX_CLAMP_BITS:
        raise ValueError(f"clamp_bits must be in [{CLAMP_BITS}, {MAX_CLAMP_BITS}], got {clamp_bits}")
    exponent = math.floor(math.log2(noise_std))
    return 2.0 ** (exponent - GRID_BITS), 2.0 ** (exponent + clamp_bits)


def snap(noisy: torch.Tensor, noise_std: float, clamp_bits: int = CLAMP_BITS) -> torch.Tensor:
    """``noisy`` (x + noise, float64) clamped to ±B and rounded to multiples of Λ, in place; float64."""
    import torch  # here, not at the top: the accounting half of this module is imported by torch-free commands

    if noisy.dtype != torch.float64:
        raise TypeError(f"snap the float64 sum, not a {noisy.dtype} one (the argument needs ulp ≪ Λ)")
    step, bound = grid(noise_std, clamp_bits)
    return noisy.clamp_(-bound, bound).div_(step).round_().mul_(step)


def snapped_coordinates(coordinates: int, clamp_bits: int = CLAMP_BITS) -> int:
    """The ``snapped`` count an event must carry for ``coordinates`` values snapped with ``clamp_bits``.

    The slack per coordinate is proportional to ulp(B)/Λ = 2^(clamp_bits − 44) (module docstring: the
    chance that the float64 sum crosses a cell edge; the cell width Λ and the density change across a
    cell do not depend on B), i.e. 2^(clamp_bits − CLAMP_BITS) times that of the default clamp, so each
    coordinate counts that many times."""
    grid(1.0, clamp_bits)  # validates clamp_bits
    return coordinates << (clamp_bits - CLAMP_BITS)


def snapping_eta(coordinates: int) -> float:
    """dη: the log-probability-ratio slack of ``coordinates`` snapped values (module docstring)."""
    return coordinates * LOG_RATIO_PER_COORDINATE


def snapped_guarantee(epsilon: float, delta: float, coordinates: int) -> tuple[float, float]:
    """(ε + 2dη, e^{dη}·δ): the guarantee of the snapped mechanism whose ideal version is (ε, δ)-DP."""
    eta = snapping_eta(coordinates)
    return epsilon + 2 * eta, min(1.0, math.exp(eta) * delta)
