"""Canaries for Private Evolution's histograms (:mod:`privlm.synthesis.pe.mechanism`): T noisy vote
histograms of K·M bins, each one Gaussian release of sensitivity 1.

Canary i is a private example of class y_i = i mod K whose (crafted) embedding *is* candidate
j_i = ⌊i/K⌋ of its class: M = ⌈m/K⌉ or more seeded random unit vectors per class in a small dimension,
pairwise distinct, so the nearest candidate of canary i is its own at distance 0 and its one vote per
iteration lands in a bin no other canary touches. The embeddings go through the library's own
:class:`~privlm.synthesis.pe.mechanism.PrivateVoter` (the wall ``privlm synth --method pe`` uses:
:func:`vote_counts`, then :func:`noisy_histograms` — fresh OS key per histogram, float64, snapped) at
the σ of :func:`noise_multiplier` for T iterations of the default :class:`PEConfig`, T times over fixed
candidates (PE's guarantee covers any public candidates, chosen adaptively or not). The claim is what
PE's ledger reports for those T draws (:func:`histogram_entry`, PLD).

Score of canary i: its bin's noisy count summed over the T histograms, T + √T·σZ in, √T·σZ out. Its bin
is the only part of the release canary i moves, and given the other bins the sum is sufficient for "in
vs out" (likelihood ratio monotone in it): no score does better, and the audit faces the composed
Gaussian of μ = √T/σ — the same μ that the PLD accounting of T releases turns into the claimed ε. Like
GRADMM's cell, the noise key comes from the OS: this audit run is not reproducible (the canaries are).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from privlm.audit.outcome import CanaryOutcome, inclusion_bits
from privlm.audit.scale import Scale
from privlm.errors import UserError
from privlm.privacy.ledger import Ledger
from privlm.synthesis.pe.config import PEConfig
from privlm.synthesis.pe.mechanism import (
    PrivateVoter,
    histogram_entry,
    histogram_snapped,
    noise_multiplier,
    unit_rows,
)


@dataclass(frozen=True)
class PECanaries:
    """m canaries, one dedicated candidate bin each, in K classes; embeddings of ``dimension``
    coordinates; ``config``: the PE settings audited (T = ``config.iterations``)."""

    canaries: int = 1000
    classes: int = 2
    dimension: int = 8
    config: PEConfig = field(default_factory=PEConfig)

    def per_class(self) -> int:
        """The smallest ``--per-class`` n whose population M = config.candidates(n) holds ⌈m/K⌉ canaries."""
        need = math.ceil(self.canaries / self.classes)
        return next(n for n in itertools.count(1) if self.config.candidates(n) >= need)

    def candidates(self, seed: int) -> list[np.ndarray]:
        """Per class, M seeded unit vectors (M × ``dimension``); canary i is row ⌊i/K⌋ of class i mod K."""
        rng = np.random.default_rng([seed, 0x9E])
        m = self.config.candidates(self.per_class())
        return [unit_rows(rng.standard_normal((m, self.dimension))) for _ in range(self.classes)]

    def run(self, epsilon: float, delta: float, seed: int = 0) -> CanaryOutcome:
        """Insert the included canaries, draw PE's T noisy histograms once, score every canary (module docstring)."""
        if self.canaries < 2 or self.classes < 1 or self.dimension < 2:
            raise UserError(
                f"need >= 2 canaries, >= 1 class and dimension >= 2, got {self.canaries}, "
                f"{self.classes}, {self.dimension}"
            )
        included = inclusion_bits(self.canaries, seed)
        candidates = self.candidates(seed)
        index = np.arange(self.canaries)
        labels, slots = index % self.classes, index // self.classes
        crafted = np.stack([candidates[y][j] for y, j in zip(labels, slots)])

        def embed(texts: Sequence[str]) -> np.ndarray:  # the crafted embedding of "canary i"
            return crafted[[int(t) for t in texts]].reshape(len(texts), self.dimension)

        def load_private() -> list[tuple[str, int]]:
            return [(str(i), int(labels[i])) for i in np.flatnonzero(included)]

        per_class, iterations = self.per_class(), self.config.iterations
        sigma = noise_multiplier(epsilon, delta, self.config, self.classes, per_class)
        voter = PrivateVoter(embed, load_private, self.classes)
        scores = np.zeros(self.canaries)
        for _ in range(iterations):
            histograms = voter.histograms(candidates, sigma)
            scores += np.stack(histograms)[labels, slots]
        snapped = histogram_snapped(self.classes, len(candidates[0]))
        ledger = Ledger([histogram_entry(sigma, snapped, t) for t in range(iterations)])
        return CanaryOutcome(
            scores=scores,
            included=included,
            accounted_epsilon=ledger.epsilon(delta),
            delta=delta,
            details={
                "noise_multiplier": sigma,
                "iterations": iterations,
                "candidates_per_class": len(candidates[0]),
                "per_class": per_class,
                "classes": self.classes,
                "embedding_dimension": self.dimension,
            },
        )


def run_cell(mode: str, epsilon: float, scale: Scale, delta: float, seed: int) -> CanaryOutcome:
    """Audit entry point ``pe``: T noisy vote histograms at ε (``mode`` is ``histograms``, PE's only one)."""
    return PECanaries(canaries=scale.pe_canaries).run(epsilon, delta, seed=seed)
