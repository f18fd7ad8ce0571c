"""Compose recorded releases and answer ε(δ) and δ(ε), on Google's dp-accounting.

``method="pld"`` (default) uses privacy-loss distributions with pessimistic (connect-the-dots)
discretization: the reported ε is an upper bound on the true ε of the composition, larger by at most
the discretization error (≈ steps × ``value_discretization`` in the worst case, far less in practice).
``method="rdp"`` uses Rényi DP (looser, kept for comparison with older reports); it covers exact
clipping and Gaussian releases only, because the randomized-clipping sensitivity has a polynomial
tail and every Rényi divergence of its envelope mixture is infinite.

Events that snapped their output (:mod:`privlm.privacy.snapping`) add their slack: with η the sum of
count × snapped coordinates × 2⁻³⁴ over all events, ε(δ) = ε_ideal(δ·e^{−η}) + 2η.

Identical events are grouped and self-composed (FFT), so recording 10,000 steps one at a time costs
no more than recording them once with ``count=10_000``. Adjacency: add/remove-one; the PLD reports the
worse of the two directions.
"""

from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache
from typing import Literal

import dp_accounting
from dp_accounting.pld import privacy_loss_distribution as pld_lib

from privlm.errors import UserError
from privlm.privacy.events import Event, GaussianRelease, PoissonGaussianStep
from privlm.privacy.randomized import randomized_clipping_pld
from privlm.privacy.snapping import snapping_eta
from privlm.privacy.validation import check_count, check_delta, check_epsilon

Method = Literal["pld", "rdp"]
DEFAULT_DISCRETIZATION = 1e-4


class PrivacyAccountant:
    """Composes privacy events; ``epsilon(delta)`` is a valid (ε, δ)-DP guarantee for everything recorded."""

    def __init__(self, method: Method = "pld", value_discretization: float = DEFAULT_DISCRETIZATION) -> None:
        if method not in ("pld", "rdp"):
            raise UserError(f"accounting method must be 'pld' or 'rdp', got {method!r}")
        if not (math.isfinite(value_discretization) and value_discretization > 0):
            raise UserError(f"value_discretization must be positive, got {value_discretization!r}")
        self.method: Method = method
        self.value_discretization = float(value_discretization)
        self._counts: Counter[Event] = Counter()
        self._composed: pld_lib.PrivacyLossDistribution | dp_accounting.rdp.RdpAccountant | None = None

    def record(self, event: Event, count: int = 1) -> None:
        """Add ``count`` repetitions of ``event`` (adaptive composition)."""
        if not isinstance(event, (PoissonGaussianStep, GaussianRelease)):
            raise UserError(f"not a privacy event: {event!r}")
        check_count(count, "count")
        if self.method == "rdp" and isinstance(event, PoissonGaussianStep) and event.randomized:
            raise UserError(
                f"RDP cannot account {event.clipping} clipping (unbounded random sensitivity makes every "
                "Rényi divergence infinite); use method='pld'"
            )
        self._counts[event] += count
        self._composed = None

    @property
    def events(self) -> tuple[tuple[Event, int], ...]:
        """Distinct recorded events with their total counts, in first-recorded order."""
        return tuple(self._counts.items())

    def epsilon(self, delta: float) -> float:
        """Smallest ε (upper bound) such that everything recorded is (ε, δ)-DP; 0 if nothing was recorded."""
        check_delta(delta)
        if not self._counts:
            return 0.0
        composed, eta = self._compose(), self._snapping_eta()
        ideal_delta = delta * math.exp(-eta)
        if self.method == "rdp":
            return float(composed.get_epsilon(ideal_delta)) + 2 * eta
        return float(composed.get_epsilon_for_delta(ideal_delta)) + 2 * eta

    def delta(self, epsilon: float) -> float:
        """Upper bound on the smallest δ such that everything recorded is (ε, δ)-DP."""
        check_epsilon(epsilon)
        if not self._counts:
            return 0.0
        composed, eta = self._compose(), self._snapping_eta()
        if epsilon <= 2 * eta:
            return 1.0
        if self.method == "rdp":
            ideal = float(composed.get_delta(epsilon - 2 * eta))
        else:
            ideal = float(composed.get_delta_for_epsilon(epsilon - 2 * eta))
        return min(1.0, math.exp(eta) * ideal)

    def _snapping_eta(self) -> float:
        return sum(count * snapping_eta(event.snapped) for event, count in self._counts.items())

    def _compose(self) -> pld_lib.PrivacyLossDistribution | dp_accounting.rdp.RdpAccountant:
        if self._composed is None:
            self._composed = self._compose_rdp() if self.method == "rdp" else self._compose_pld()
        return self._composed

    def _compose_pld(self) -> pld_lib.PrivacyLossDistribution:
        composed = None
        for event, count in self._counts.items():
            pld = single_event_pld(event, self.value_discretization)
            pld = pld.self_compose(count) if count > 1 else pld
            composed = pld if composed is None else composed.compose(pld)
        return composed

    def _compose_rdp(self) -> dp_accounting.rdp.RdpAccountant:
        accountant = dp_accounting.rdp.RdpAccountant()
        for event, count in self._counts.items():
            gaussian = dp_accounting.GaussianDpEvent(event.noise_multiplier)
            if isinstance(event, PoissonGaussianStep):
                accountant.compose(dp_accounting.PoissonSampledDpEvent(event.sample_rate, gaussian), count)
            else:
                accountant.compose(gaussian, count)
        return accountant


Accountant = PrivacyAccountant


@lru_cache(maxsize=8)
def single_event_pld(event: Event, value_discretization: float) -> pld_lib.PrivacyLossDistribution:
    """Pessimistic PLD of one event (add and remove adjacency), cached by (event, discretization)."""
    if isinstance(event, GaussianRelease):
        return pld_lib.from_gaussian_mechanism(
            event.noise_multiplier, value_discretization_interval=value_discretization
        )
    if event.randomized:
        probes = event.envelope_probes
        if probes is None:  # PoissonGaussianStep refuses randomized clipping without probes
            raise UserError(f"{event.clipping} clipping needs the number of probes")
        return randomized_clipping_pld(event.sample_rate, event.noise_multiplier, probes, value_discretization)
    return pld_lib.from_gaussian_mechanism(
        event.noise_multiplier,
        sampling_prob=event.sample_rate,
        value_discretization_interval=value_discretization,
    )
