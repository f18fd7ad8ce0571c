"""Privacy-loss distribution of one DP-SGD step whose clipping scale is random (DP-SGD-RC).

Mechanism. With estimated norms the clipped gradient of the differing example has L2 norm at most
C·S, where S is random (probes are drawn independently of the data) and, by the envelope of
:mod:`privlm.privacy.envelope`, stochastically dominated by S_env = max(1, X^{-1/2}), X ~ χ²_k/k.
Assumptions, all stated here because the guarantee rests on them:

1. The envelope holds: P(n̂²/n² ≤ x) ≤ P(χ²_k/k ≤ x) for x < 1 for every spectrum (tested by Monte
   Carlo, see ``envelope.py``); Hutch++ with m probes is accounted with k = ⌊m/3⌋.
2. The scale is treated as revealed: the step's output is analysed jointly with the probe draw, so its
   hockey-stick curve is the mixture E_S[δ_S(ε)] of Poisson-subsampled Gaussian curves with sensitivity
   S (this upper-bounds the mechanism that keeps S hidden, by post-processing). Each δ_s is increasing
   in s (N(s, σ²) post-processes into N(s', σ²) for s' < s), so replacing S by S_env dominates.
3. Fresh probes every step and Poisson sampling with rate q; add/remove-one adjacency, both directions.

Pessimistic discretization (every step below can only increase δ(ε) for every ε):

* Sensitivity. S_env is binned on a grid 1 = s_0 < s_1 < … < s_B: the atom S = 1 (X ≥ 1), 256
  equal-probability bins, and a geometric grid of ratio 1.005 up to the 1 − 1e-10 quantile of S_env
  and 1.05 beyond; every bin uses its largest sensitivity (smallest X). The mass
  above s_B, P(S_env > s_B), is given infinite sensitivity: the subsampled pair then has loss +∞ with
  probability q (remove) and −ln(1−q) otherwise, which dominates every finite sensitivity. s_B is the
  smaller of the (1 − ``tail_mass``) quantile of S_env (so the infinite-loss mass is at most
  q·``tail_mass`` per step, 1e-13 over 10⁵ steps at the default, negligible against any δ ≥ 1e-10) and
  ``max_scaled_sensitivity``·σ (beyond 12σ a sampled example already has privacy loss ≳ 30, so calling
  it infinite changes nothing at any ε below ~25; past that the mass is the real cost of small k).
* Tails. A component of probability p keeps all but ``COMPONENT_TAIL`` = 1e-18 of its mass (absolute, on
  each side) on its loss range, at most ``loss_cap`` = 30 in absolute value; losses below are rounded up
  to the range's lower end and losses above are moved to +∞. Components lighter than 2e-18 join the
  infinite-sensitivity mass.
* Curves. Each component's exact hockey-stick curve (closed form) is evaluated at every grid point near
  ε = 0 and near its range ends and at every 16th point elsewhere, with chords in e^ε in between; δ(ε)
  is convex in e^ε, so chords lie above it.
* Loss values. Connect-the-dots (Doroshenko et al. 2022, via dp-accounting) on the mixture curve at the
  multiples of ``value_discretization``; the resulting PLD dominates the true one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np
from dp_accounting.pld import pld_pmf
from dp_accounting.pld.privacy_loss_distribution import PrivacyLossDistribution
from scipy.special import log_ndtr, ndtri

from privlm.privacy.envelope import sensitivity_quantile_above, sensitivity_survival
from privlm.privacy.validation import check_count, check_noise_multiplier, check_sample_rate

Adjacency = Literal["remove", "add"]

TAIL_MASS = 1e-15
MAX_SCALED_SENSITIVITY = 12.0
LOSS_CAP = 30.0
QUANTILE_BINS = 256
MAX_RATIO = 1.005
FINE_MASS = 1e-10
COARSE_RATIO = 1.05
TOP_MASS = 1e-16
COMPONENT_TAIL = 1e-18
_NODE_STRIDE = 16
_FAR_NODE_STRIDE = 128
_DENSE_WINDOW = 0.25
_NEAR_WINDOW = 2.0


@dataclass(frozen=True)
class SensitivityGrid:
    """Pessimistic discretization of the random sensitivity (units of C).

    ``sensitivities[b]`` (ascending, the first is 1) carries probability ``probabilities[b]``;
    ``tail_probability`` is the mass treated as infinite sensitivity; together they sum to one.
    """

    sensitivities: np.ndarray
    probabilities: np.ndarray
    tail_probability: float


def sensitivity_grid(
    probes: int,
    noise_multiplier: float,
    *,
    quantile_bins: int = QUANTILE_BINS,
    max_ratio: float = MAX_RATIO,
    tail_mass: float = TAIL_MASS,
    max_scaled_sensitivity: float = MAX_SCALED_SENSITIVITY,
) -> SensitivityGrid:
    """Bins of S_env = max(1, X^{-1/2}), X ~ χ²_k/k; each bin's mass sits at its upper edge."""
    check_count(probes, "probes")
    check_noise_multiplier(noise_multiplier)
    s_max = min(
        float(sensitivity_quantile_above(tail_mass, probes)), max(1.0, max_scaled_sensitivity * noise_multiplier)
    )
    edges = np.array([1.0])
    if s_max > 1.0:
        s_fine = min(s_max, float(sensitivity_quantile_above(FINE_MASS, probes)))
        geometric = np.concatenate([_geometric(1.0, s_fine, max_ratio), _geometric(s_fine, s_max, COARSE_RATIO)])
        above_1, above_max = sensitivity_survival([1.0, s_max], probes)
        levels = above_max + (above_1 - above_max) * np.arange(quantile_bins - 1, 0, -1) / quantile_bins
        quantiles = sensitivity_quantile_above(levels, probes)
        inner = np.concatenate([geometric, quantiles])
        edges = np.unique(np.concatenate([[1.0], inner[(inner > 1.0) & (inner < s_max)], [s_max]]))
    edges = np.asarray(edges, dtype=float)
    survival = sensitivity_survival(edges, probes)
    probabilities = np.concatenate([[1.0 - survival[0]], survival[:-1] - survival[1:]])
    return SensitivityGrid(edges, np.clip(probabilities, 0.0, None), float(survival[-1]))


def _geometric(start: float, stop: float, ratio: float) -> np.ndarray:
    """start·ratio, start·ratio², … up to the first point ≥ stop."""
    count = math.ceil(math.log(stop / start) / math.log(ratio)) if stop > start else 0
    return start * ratio ** np.arange(1, count + 1)


def subsampled_gaussian_delta(
    epsilons: np.ndarray, sensitivity: float, noise_multiplier: float, sample_rate: float, adjacency: Adjacency
) -> np.ndarray:
    """Exact hockey-stick curve δ(ε) of the Poisson-subsampled Gaussian mechanism (vectorized in ε).

    remove: P = (1−q)N(0, σ²) + qN(s, σ²) against Q = N(0, σ²); add: the reverse pair.
    """
    eps = np.asarray(epsilons, dtype=float)
    mu, q = sensitivity / noise_multiplier, sample_rate
    delta = np.zeros_like(eps)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        if adjacency == "remove":
            low = np.log1p(-q) >= eps if q < 1.0 else np.zeros_like(eps, dtype=bool)
            delta[low] = -np.expm1(eps[low])
            e = eps[~low]
            log_excess = e + np.log1p(-(1.0 - q) * np.exp(-e))  # ln(e^ε − 1 + q)
            x = (log_excess - math.log(q) + mu * mu / 2.0) / mu
            log_a = math.log(q) + log_ndtr(mu - x)
            log_b = log_excess + log_ndtr(-x)
            delta[~low] = _difference(log_a, log_b)
        else:
            high = eps >= -np.log1p(-q) if q < 1.0 else np.zeros_like(eps, dtype=bool)
            e = eps[~high]
            log_room = np.log1p(-(1.0 - q) * np.exp(e))  # ln(1 − (1−q)e^ε)
            x = (-e + log_room - math.log(q) + mu * mu / 2.0) / mu
            log_a = log_room + log_ndtr(x)
            log_b = math.log(q) + e + log_ndtr(x - mu)
            delta[~high] = _difference(log_a, log_b)
    return np.clip(delta, 0.0, 1.0)


def mixture_pld(
    grid: SensitivityGrid,
    sample_rate: float,
    noise_multiplier: float,
    value_discretization: float,
    loss_cap: float = LOSS_CAP,
) -> PrivacyLossDistribution:
    """Pessimistic PLD (remove and add) of the revealed-scale mixture of subsampled Gaussians over ``grid``."""
    check_sample_rate(sample_rate)
    check_noise_multiplier(noise_multiplier)
    pmfs = [
        _mixture_pmf(grid, sample_rate, noise_multiplier, value_discretization, loss_cap, adjacency)
        for adjacency in ("remove", "add")
    ]
    return PrivacyLossDistribution(*pmfs)


def randomized_clipping_pld(
    sample_rate: float, noise_multiplier: float, probes: int, value_discretization: float
) -> PrivacyLossDistribution:
    """PLD of one Poisson-subsampled Gaussian step with Hutchinson-estimated clipping (k = ``probes``)."""
    grid = sensitivity_grid(probes, noise_multiplier)
    return mixture_pld(grid, sample_rate, noise_multiplier, value_discretization)


def _difference(log_a: np.ndarray, log_b: np.ndarray) -> np.ndarray:
    """exp(log_a) − exp(log_b), clipped at 0, without cancellation."""
    out = np.exp(log_a) * -np.expm1(np.minimum(log_b - log_a, 0.0))
    return np.where(log_b >= log_a, 0.0, out)


def _loss_range(mu: float, q: float, z: float, adjacency: Adjacency, loss_cap: float) -> tuple[float, float]:
    """Losses holding all but Φ(−z) of one component's mass on each side, clipped to ±loss_cap."""
    log_keep = math.log1p(-q) if q < 1.0 else -math.inf

    def remove_loss(x: float) -> float:  # increasing in x
        return float(np.logaddexp(log_keep, math.log(q) + mu * x - mu * mu / 2.0))

    if adjacency == "remove":
        low, high = remove_loss(-z), remove_loss(mu + z)
    else:
        low, high = -remove_loss(z), -remove_loss(-z)
    return max(low, -loss_cap), min(high, loss_cap)


def _mixture_pmf(
    grid: SensitivityGrid,
    q: float,
    sigma: float,
    step: float,
    loss_cap: float,
    adjacency: Adjacency,
) -> pld_pmf.PLDPmf:
    # A component of probability p keeps all but COMPONENT_TAIL (absolute) of its mass in range; a
    # component lighter than that joins the infinite-sensitivity tail (a pessimistic move).
    keep = grid.probabilities > 2.0 * COMPONENT_TAIL
    sensitivities, probabilities = grid.sensitivities[keep], grid.probabilities[keep]
    tail_probability = grid.tail_probability + float(grid.probabilities[~keep].sum())
    z = -ndtri(COMPONENT_TAIL / probabilities)
    ranges = [_loss_range(s / sigma, q, z_b, adjacency, loss_cap) for s, z_b in zip(sensitivities, z)]
    lows, highs = [low for low, _ in ranges], [high for _, high in ranges]
    if tail_probability > 0.0 and q < 1.0:  # the finite loss of the infinite-sensitivity pair
        atom = math.log1p(-q) if adjacency == "remove" else -math.log1p(-q)
        lows.append(min(max(atom, -loss_cap), loss_cap))
        highs.append(lows[-1])
    i_lo, i_hi = math.floor(min(lows) / step), math.ceil(max(highs) / step)
    i_hi = max(i_hi, i_lo + 1)
    eps = np.arange(i_lo, i_hi + 1) * step
    t = np.exp(eps - eps[0])  # ∝ e^ε; at most e^{2·loss_cap}, no overflow
    nodes = _nodes(eps, q)
    node_eps = eps[nodes]
    mixture = np.zeros(len(nodes))
    # Each component is its exact curve at the nodes of its loss range (snapped outwards to nodes),
    # chords in e^ε between nodes (δ is convex in e^ε, so chords lie above it), and outside its range a
    # pessimistic extension: below as if its losses there were rounded up to the range start
    # (δ = 1 − e^{ε−ε_lo}(1 − δ_lo), linear in e^ε), above as if they were moved to +∞ (δ = δ_hi).
    # Every component is thus piecewise linear in e^ε with breakpoints at the shared nodes, so the
    # mixture is computed at the nodes and interpolated once. The extensions are accumulated with sums
    # of non-negative terms only (no cancellation).
    below_mass, below_scale, above = np.zeros_like(mixture), np.zeros_like(mixture), np.zeros_like(mixture)
    for s, p, (low, high) in zip(sensitivities, probabilities, ranges):
        a = int(np.searchsorted(nodes, math.floor(low / step) - i_lo, side="right")) - 1
        b = max(int(np.searchsorted(nodes, math.ceil(high / step) - i_lo, side="left")), a)
        exact = subsampled_gaussian_delta(node_eps[a : b + 1], s, sigma, q, adjacency)
        mixture[a : b + 1] += p * exact
        if a > 0:
            below_mass[a - 1] += p
            below_scale[a - 1] += p * (1.0 - exact[0]) * math.exp(-node_eps[a])
        if b + 1 < len(nodes):
            above[b + 1] += p * exact[-1]

    def reverse_cumsum(x: np.ndarray) -> np.ndarray:
        return np.cumsum(x[::-1])[::-1]

    mixture += reverse_cumsum(below_mass) - reverse_cumsum(below_scale) * np.exp(node_eps) + np.cumsum(above)
    if tail_probability > 0.0:
        mixture += tail_probability * _infinite_sensitivity_delta(node_eps, q, adjacency)
    deltas = np.interp(t, t[nodes], mixture)
    deltas = np.clip(np.maximum.accumulate(deltas[::-1])[::-1], 0.0, 1.0)
    # end the grid where δ ≤ TOP_MASS: connect-the-dots puts δ(ε_top) at +∞ (pessimistic, shorter PMF)
    top = max(int(np.argmax(deltas <= TOP_MASS)) if deltas[-1] <= TOP_MASS else len(deltas) - 1, 1)
    return pld_pmf.create_pmf_pessimistic_connect_dots_fixed_gap(step, i_lo, i_lo + top, deltas[: top + 1])


def _nodes(eps: np.ndarray, q: float) -> np.ndarray:
    """Grid indices where curves are evaluated exactly (sorted, including both ends).

    Every point within ``_DENSE_WINDOW`` of ε = 0 (subsampled losses concentrate there, at scale ~q) and
    of the kinks at ±ln(1 − q), and within 64 points of both ends; every 16th point for |ε| ≤ 2 and
    every 128th beyond (there the curves vary on the scale of the noise, ≥ 0.1).
    """
    n = len(eps)
    step = eps[1] - eps[0]

    def index_of(value: float) -> int:
        return min(max(int(round((value - eps[0]) / step)), 0), n)

    is_node = np.zeros(n, dtype=bool)
    is_node[: 4 * _NODE_STRIDE] = True
    is_node[n - 4 * _NODE_STRIDE :] = True
    is_node[index_of(-_DENSE_WINDOW) : index_of(_DENSE_WINDOW)] = True
    if q < 1.0:
        for kink in (math.log1p(-q), -math.log1p(-q)):
            centre = index_of(kink)
            is_node[max(centre - 4 * _NODE_STRIDE, 0) : centre + 4 * _NODE_STRIDE] = True
    is_node[index_of(-_NEAR_WINDOW) : index_of(_NEAR_WINDOW) : _NODE_STRIDE] = True
    is_node[::_FAR_NODE_STRIDE] = True
    is_node[-1] = True
    return np.flatnonzero(is_node)


def _infinite_sensitivity_delta(eps: np.ndarray, q: float, adjacency: Adjacency) -> np.ndarray:
    """δ(ε) of the limit s → ∞: remove has loss +∞ w.p. q and ln(1−q) otherwise; add has −ln(1−q)."""
    if adjacency == "remove":
        return q + np.maximum(0.0, 1.0 - q - np.exp(eps))
    return np.maximum(0.0, 1.0 - np.exp(eps) * (1.0 - q))
