"""Monte Carlo check of the randomized-clipping envelope F_env(x) = P(χ²_k/k ≤ x) (x < 1), 1 (x ≥ 1).

For every spectrum w and k we draw n samples of Q_w = Σ_j w_j X_j, X_j i.i.d. χ²_k/k, and test two
one-sided hypotheses that must hold if F_env dominates the CDF of Q_w:

* DKW: sup_x (F̂_n(x) − F_env(x)) ≤ t with P(sup_x (F̂_n − F) > t) ≤ exp(−2nt²);
* tail binomial tests at the envelope quantiles p ∈ {1e-3, 1e-2, 0.1}: #{Q ≤ F_env⁻¹(p)} is not
  improbably large for a Binomial(n, p).

All thresholds are Bonferroni-corrected over every (spectrum, k, check), so if the envelope holds the
whole test fails with probability at most ALPHA = 1e-3 (the seed is fixed, so it is deterministic).
A control shows the same checks reject a wrong envelope (χ²_{2k}/(2k), i.e. claiming twice the probes).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import binom, chi2

from privlm.privacy.envelope import envelope_cdf, sensitivity_quantile_above, sensitivity_survival

ALPHA = 1e-3
N_SAMPLES = 10_000
PROBES = (4, 8, 32, 128)
TAIL_LEVELS = (1e-3, 1e-2, 0.1)


def _spectra(rng: np.random.Generator) -> list[np.ndarray]:
    spectra: list[np.ndarray] = []
    for concentration in (0.05, 0.3, 1.0, 5.0):  # 4 × 30 Dirichlet spectra with 2..20 terms
        for draw in range(30):
            m = (2, 3, 5, 10, 20)[draw % 5]
            spectra.append(rng.dirichlet(np.full(m, concentration)))
    for m in np.unique(np.round(np.geomspace(1, 1000, 50)).astype(int)):  # uniform over m = 1..1000 terms
        spectra.append(np.full(m, 1.0 / m))
    for a in np.linspace(0.5, 0.999, 40):  # two-term sweep (a, 1 − a)
        spectra.append(np.array([a, 1.0 - a]))
    return spectra


def _sample(w: np.ndarray, k: int, n: int, rng: np.random.Generator) -> np.ndarray:
    if np.all(w == w[0]):  # uniform weights: Σ_j X_j / m is exactly χ²_{km}/(km)
        return rng.chisquare(k * len(w), size=n) / (k * len(w))
    return (rng.chisquare(k, size=(n, len(w))) / k) @ w


def _violations(samples: np.ndarray, cdf, n_checks: int) -> list[str]:
    """Reasons the empirical CDF of ``samples`` exceeds ``cdf`` beyond sampling error (empty if none)."""
    n = len(samples)
    level = ALPHA / n_checks
    ordered = np.sort(samples)
    excess = float(np.max(np.arange(1, n + 1) / n - cdf(ordered)))
    found = []
    if excess > math.sqrt(math.log(1.0 / level) / (2 * n)):
        found.append(f"DKW excess {excess:.4f}")
    return found


def _tail_violations(samples: np.ndarray, quantile, n_checks: int) -> list[str]:
    n = len(samples)
    level = ALPHA / n_checks
    found = []
    for p in TAIL_LEVELS:
        count = int(np.sum(samples <= quantile(p)))
        if binom.sf(count - 1, n, p) < level:  # P(Bin(n, p) ≥ count)
            found.append(f"{count} samples below the {p} envelope quantile")
    return found


def test_envelope_dominates_every_spectrum() -> None:
    rng = np.random.default_rng(20240611)
    spectra = _spectra(rng)
    assert len(spectra) >= 200
    n_checks = len(spectra) * len(PROBES) * (1 + len(TAIL_LEVELS))
    failures = []
    for k in PROBES:
        for w in spectra:
            samples = _sample(w, k, N_SAMPLES, rng)
            found = _violations(samples, lambda x, k=k: envelope_cdf(x, k), n_checks)
            found += _tail_violations(samples, lambda p, k=k: chi2.ppf(p, k) / k, n_checks)
            if found:
                failures.append((k, np.round(np.sort(w)[::-1][:4], 3).tolist(), len(w), found))
    assert not failures, failures[:5]


def test_checks_reject_a_wrong_envelope() -> None:
    """Control: claiming 2k probes (χ²_{2k}/(2k)) is caught on the single-term spectrum."""
    rng = np.random.default_rng(7)
    n_checks = 200 * len(PROBES) * (1 + len(TAIL_LEVELS))
    for k in PROBES:
        samples = _sample(np.array([1.0]), k, N_SAMPLES, rng)
        wrong_cdf = lambda x, k=k: np.where(x < 1, chi2.cdf(2 * k * np.clip(x, 0, None), 2 * k), 1.0)  # noqa: E731
        wrong_quantile = lambda p, k=k: chi2.ppf(p, 2 * k) / (2 * k)  # noqa: E731
        assert _violations(samples, wrong_cdf, n_checks) or _tail_violations(samples, wrong_quantile, n_checks)


@pytest.mark.parametrize("k", PROBES)
def test_envelope_shape(k: int) -> None:
    x = np.array([0.0, 0.2, 0.7, 0.999, 1.0, 3.0])
    cdf = envelope_cdf(x, k)
    assert np.all(np.diff(cdf) >= 0) and cdf[0] == 0.0 and np.all(cdf[4:] == 1.0)
    assert cdf[3] == pytest.approx(chi2.cdf(0.999 * k, k))
    s = np.array([0.5, 1.0, 1.5, 4.0])
    survival = sensitivity_survival(s, k)  # P(max(1, X^{-1/2}) > s)
    assert survival[0] == 1.0 and survival[1] == pytest.approx(chi2.cdf(k, k))
    assert survival[2] == pytest.approx(chi2.cdf(k / 2.25, k))
    assert sensitivity_quantile_above(survival[2:], k) == pytest.approx(s[2:])
