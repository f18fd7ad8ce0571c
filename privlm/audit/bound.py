"""The one-run lower bound on ε (Steinke, Nasr, Jagielski, NeurIPS 2023, "Privacy auditing with one (1)
training run", Theorem 3.1 / its Appendix D form), implemented here from the statement.

Setting. m canaries, each included independently with probability ½; the mechanism runs once; the
auditor guesses "in" or "out" for r of them (abstaining on the rest) and v guesses are correct. If the
mechanism is (ε, δ)-DP with respect to each canary (add/remove), then for every v

    P[V ≥ v] ≤ β(v) + 2mδ · α(v),   β(v) = P[W ≥ v],   α(v) = max_{1≤i≤v} P[v − i ≤ W < v] / i,

with W ~ Binomial(r, e^ε/(1 + e^ε)) (the accuracy of ε-randomized response). The right-hand side is
the p-value of "the mechanism is (ε, δ)-DP" given v; every ε whose p-value is below 1 − confidence is
rejected, and since (ε, δ)-DP implies (ε', δ)-DP for every ε' ≥ ε, rejecting one ε rejects all smaller
ones: the largest rejected ε is a lower bound that holds with probability ≥ confidence over the
canaries' inclusion coins and the mechanism's randomness.

Several guess counts. Trying K guess counts r and keeping the best bound is valid when each is tested
at level (1 − confidence)/K (Bonferroni): under the null, P[some test rejects] ≤ K·(1 − confidence)/K.
:func:`best_lower_bound` does exactly that; the confidence it reports is the family's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

from privlm.errors import UserError

DEFAULT_CONFIDENCE = 0.95
_BISECTIONS = 60
_EPS_CEILING = 200.0


def _check_counts(m: int, r: int, v: int) -> None:
    if not (isinstance(m, int) and isinstance(r, int) and isinstance(v, int)) or not 0 <= v <= r <= m:
        raise UserError(f"need integers 0 <= correct <= guesses <= canaries, got v={v!r}, r={r!r}, m={m!r}")


def _check_delta_confidence(delta: float, confidence: float) -> None:
    if not 0 <= delta < 1:
        raise UserError(f"delta must be in [0, 1), got {delta!r}")
    if not 0 < confidence < 1:
        raise UserError(f"confidence must be in (0, 1), got {confidence!r}")


def p_value(m: int, r: int, v: int, epsilon: float, delta: float) -> float:
    """Upper bound on P[≥ v correct guesses out of r] for an (ε, δ)-DP mechanism with m canaries."""
    _check_counts(m, r, v)
    _check_delta_confidence(delta, DEFAULT_CONFIDENCE)
    if not epsilon >= 0:
        raise UserError(f"epsilon must be >= 0, got {epsilon!r}")
    accuracy = 1.0 / (1.0 + math.exp(-epsilon))
    tail = float(binom.sf(v - 1, r, accuracy))  # P[W ≥ v]
    if delta == 0 or v == 0:
        return min(tail, 1.0)
    below = binom.pmf(np.arange(v - 1, -1, -1), r, accuracy)  # P[W = v−1], P[W = v−2], …, P[W = 0]
    window = np.cumsum(below) / np.arange(1, v + 1)  # P[v − i ≤ W < v] / i for i = 1..v
    return min(tail + 2.0 * m * delta * float(window.max()), 1.0)


def epsilon_lower_bound(m: int, r: int, v: int, delta: float, confidence: float = DEFAULT_CONFIDENCE) -> float:
    """Largest ε (to bisection precision, rounded down) that v correct guesses out of r reject at
    ``confidence``: with that probability the mechanism is not (ε, δ)-DP. 0 when nothing is rejected."""
    _check_counts(m, r, v)
    _check_delta_confidence(delta, confidence)
    level = 1.0 - confidence
    if p_value(m, r, v, 0.0, delta) >= level:
        return 0.0
    lo, hi = 0.0, 1.0
    while p_value(m, r, v, hi, delta) < level:  # invariant: lo is rejected, hi is not
        lo, hi = hi, 2.0 * hi
        if hi > _EPS_CEILING:
            return lo
    for _ in range(_BISECTIONS):
        mid = 0.5 * (lo + hi)
        if p_value(m, r, v, mid, delta) < level:
            lo = mid
        else:
            hi = mid
    return lo


@dataclass(frozen=True)
class Guesses:
    """What the auditor's guesses achieved: r guesses (``guesses``), v of them right (``correct``)."""

    guesses: int
    correct: int


def count_correct(scores: Sequence[float], included: Sequence[bool], guesses: int) -> Guesses:
    """Guess "in" for the ⌈r/2⌉ highest scores and "out" for the ⌊r/2⌋ lowest; count the right ones.
    Ties are broken by canary index (the order is fixed before the run)."""
    scores_arr, inside = np.asarray(scores, dtype=float), np.asarray(included, dtype=bool)
    if scores_arr.shape != inside.shape or scores_arr.ndim != 1:
        raise UserError(
            f"scores and inclusion bits must be two vectors of one length, got {scores_arr.shape} and {inside.shape}"
        )
    if not 0 <= guesses <= len(scores_arr):
        raise UserError(f"guesses must be in [0, {len(scores_arr)}], got {guesses}")
    if not np.isfinite(scores_arr).all():
        raise UserError("a canary score is not finite")
    order = np.argsort(scores_arr, kind="stable")
    high, low = (guesses + 1) // 2, guesses // 2
    right = int(inside[order[len(order) - high :]].sum()) if high else 0
    right += int((~inside[order[:low]]).sum())
    return Guesses(guesses, right)


@dataclass(frozen=True)
class AuditBound:
    """The reported bound: ε lower bound, its confidence, and the guess count that gave it."""

    epsilon: float
    confidence: float
    canaries: int
    guesses: int
    correct: int
    delta: float
    tried: tuple[int, ...]

    def to_dict(self) -> dict:
        """JSON-able form."""
        return {
            "epsilon_lower_bound": self.epsilon,
            "confidence": self.confidence,
            "canaries": self.canaries,
            "guesses": self.guesses,
            "correct": self.correct,
            "delta": self.delta,
            "guess_counts_tried": list(self.tried),
        }


GUESS_FRACTIONS = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0)


def default_guess_counts(m: int) -> tuple[int, ...]:
    """Guess counts fixed before the run: :data:`GUESS_FRACTIONS` of the canaries (at least 2 each)."""
    return tuple(sorted({max(2, min(m, round(m * f))) for f in GUESS_FRACTIONS}))


def perfect_guess_ceiling(
    m: int, delta: float, confidence: float = DEFAULT_CONFIDENCE, guess_counts: Sequence[int] | None = None
) -> float:
    """The largest bound :func:`best_lower_bound` can report with m canaries: every guess right. No
    mechanism, however leaky, is shown to be worse than this by such an audit."""
    counts = tuple(guess_counts) if guess_counts is not None else default_guess_counts(m)
    each = 1.0 - (1.0 - confidence) / len(counts)
    return max(epsilon_lower_bound(m, r, r, delta, each) for r in counts)


def best_lower_bound(
    scores: Sequence[float],
    included: Sequence[bool],
    delta: float,
    confidence: float = DEFAULT_CONFIDENCE,
    guess_counts: Sequence[int] | None = None,
) -> AuditBound:
    """The best bound over ``guess_counts`` (default :func:`default_guess_counts`), each tested at
    level (1 − confidence)/K so that the reported bound holds at ``confidence`` (module docstring)."""
    _check_delta_confidence(delta, confidence)
    m = len(scores)
    counts = tuple(guess_counts) if guess_counts is not None else default_guess_counts(m)
    if not counts:
        raise UserError("need at least one guess count")
    each = 1.0 - (1.0 - confidence) / len(counts)
    best: AuditBound | None = None
    for r in counts:
        g = count_correct(scores, included, r)
        eps = epsilon_lower_bound(m, g.guesses, g.correct, delta, each)
        if best is None or eps > best.epsilon:
            best = AuditBound(eps, confidence, m, g.guesses, g.correct, delta, counts)
    return best
