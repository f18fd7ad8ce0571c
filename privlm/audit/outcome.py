"""What every canary experiment hands to the bound: one score per canary, the secret inclusion bits,
and the ε the mechanism claims for the run (its accountant's)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True)
class CanaryOutcome:
    """``scores[i]`` is high when the auditor believes canary i was included; ``included[i]`` is the
    truth. ``accounted_epsilon`` at ``delta`` is what the mechanism claims; ``details`` are public
    settings of the run (σ, q, steps, …) for the report."""

    scores: np.ndarray
    included: np.ndarray
    accounted_epsilon: float
    delta: float
    details: dict = field(default_factory=dict)


def inclusion_bits(canaries: int, seed: int) -> np.ndarray:
    """Each canary in with probability ½, independently (seeded: the audit is reproducible)."""
    return np.random.default_rng([seed, 0xA0D1]).random(canaries) < 0.5
