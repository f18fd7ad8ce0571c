"""Envelope of the estimated-to-true squared norm ratio under Gaussian-probe norm estimation.

With k Gaussian probes (entries N(0, 1/k)), the estimated squared gradient norm of one example is
n̂² = Σ_j λ_j X_j with X_j i.i.d. χ²_k/k and λ_j the eigenvalues of the layers' GᵀAAᵀG (exactly computed
parts add a constant). The ratio Q = n̂²/n² = Σ_j w_j X_j therefore has weights w in the simplex that
depend on the (private) example. The accountant needs one distribution that dominates every w:

    F_env(x) = P(χ²_k/k ≤ x)  for x < 1,      F_env(x) = 1  for x ≥ 1,

i.e. Q is replaced by min(X, 1) with X ~ χ²_k/k (the single-term spectrum w = e₁ below 1, and "no
discount" above 1), so the released clipped gradient norm min(n, C/√Q) ≤ C·max(1, X^{-1/2}).

Assumption (checked, not proven here): sup_w P(Q_w ≤ x) = P(χ²_k/k ≤ x) for every x < 1. The value is
attained at w = e₁ (a rank-one example), and for x ≥ 1 the supremum is 1 (spread spectra concentrate Q
at 1), so F_env is the pointwise supremum: no single distribution dominating every spectrum can be
smaller (a tighter analysis would have to go beyond stochastic domination). Exactly computed parts only
move Q towards 1 (Q = c + (1 − c)Q', c ∈ [0, 1]);
tests/privacy/test_envelope.py checks it by Monte Carlo over Dirichlet, uniform (m = 1…1,000 terms)
and two-term spectra for k ∈ {4, 8, 32, 128}. Hutch++ with m probes uses k = ⌊m/3⌋ (see
:func:`privlm.privacy.events.hutchinson_probes`).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import chi2

from privlm.privacy.validation import check_count


def envelope_cdf(x: ArrayLike, probes: int) -> np.ndarray:
    """F_env(x) ≥ P(n̂²/n² ≤ x) for every spectrum; same shape as ``x``."""
    check_count(probes, "probes")
    x = np.asarray(x, dtype=float)
    return np.where(x < 1.0, chi2.cdf(probes * np.clip(x, 0.0, None), probes), 1.0)


def sensitivity_survival(s: ArrayLike, probes: int) -> np.ndarray:
    """P(S > s) for the envelope sensitivity S = max(1, X^{-1/2}), X ~ χ²_k/k (in units of C)."""
    check_count(probes, "probes")
    s = np.asarray(s, dtype=float)
    safe = np.maximum(s, 1.0)
    return np.where(s < 1.0, 1.0, chi2.cdf(probes / safe**2, probes))


def sensitivity_quantile_above(mass: ArrayLike, probes: int) -> np.ndarray:
    """The s ≥ 1 with P(S > s) = ``mass`` (inverse of :func:`sensitivity_survival` on its tail)."""
    check_count(probes, "probes")
    x = chi2.ppf(np.asarray(mass, dtype=float), probes) / probes
    return np.maximum(1.0, 1.0 / np.sqrt(x))
