"""The one-run bound against the paper's worked numbers, closed forms, and its defining properties."""

from __future__ import annotations

import math

import numpy as np
import pytest

from privlm.audit.bound import (
    best_lower_bound,
    count_correct,
    default_guess_counts,
    epsilon_lower_bound,
    p_value,
    perfect_guess_ceiling,
)
from privlm.errors import UserError


@pytest.mark.parametrize(
    ("m", "r", "v", "delta", "expected"),
    [
        (100, 100, 75, 0.0, 0.702),  # the worked example: 75 of 100 right, pure DP
        (100, 100, 75, 1e-4, 0.699),  # same with δ = 1e-4
        (1000, 100, 75, 1e-4, 0.673),  # 100 guesses among 1000 canaries (abstentions)
    ],
)
def test_matches_the_papers_worked_example(m, r, v, delta, expected):
    """95 % bounds of the worked example (Steinke, Nasr, Jagielski 2023), to the 3 digits given."""
    assert epsilon_lower_bound(m, r, v, delta) == pytest.approx(expected, abs=5e-4)


@pytest.mark.parametrize("r", [10, 100, 1000])
def test_perfect_guessing_without_delta_has_a_closed_form(r):
    """All r right, δ = 0: p-value (e^ε/(1+e^ε))^r = 0.05 gives ε = logit(0.05^(1/r))."""
    q = 0.05 ** (1 / r)
    assert epsilon_lower_bound(r, r, r, 0.0) == pytest.approx(math.log(q / (1 - q)), rel=1e-9)


def test_published_value_with_delta():
    """500 canaries, 100 guesses all right, δ = 1e-5: 3.4792 (a published one-run audit table)."""
    assert epsilon_lower_bound(500, 100, 100, 1e-5) == pytest.approx(3.47920, abs=1e-4)


def test_p_value_is_a_probability_and_grows_with_epsilon():
    values = [p_value(1000, 200, 150, eps, 1e-5) for eps in np.linspace(0, 6, 25)]
    assert all(0 <= a <= b <= 1 for a, b in zip(values, values[1:]))


def test_monotone_in_correct_guesses_and_zero_at_chance():
    bounds = [epsilon_lower_bound(1000, 200, v, 1e-5) for v in range(0, 201, 5)]
    assert all(a <= b for a, b in zip(bounds, bounds[1:]))
    assert bounds[20] == 0.0  # v = 100 of 200: chance
    assert epsilon_lower_bound(1000, 200, 110, 1e-5) == 0.0  # above chance, not significant
    assert bounds[-1] > 2.5


@pytest.mark.parametrize("delta", [0.0, 1e-5, 1e-3])
def test_never_above_a_perfect_guess(delta):
    for r in (20, 100, 400):
        ceiling = epsilon_lower_bound(1000, r, r, delta)
        assert all(epsilon_lower_bound(1000, r, v, delta) <= ceiling for v in range(r + 1))


def test_confidence_and_delta_only_weaken_the_bound():
    base = epsilon_lower_bound(1000, 200, 170, 1e-5, 0.95)
    assert epsilon_lower_bound(1000, 200, 170, 1e-5, 0.99) < base
    assert 0 < epsilon_lower_bound(1000, 200, 170, 1e-4) < base
    assert epsilon_lower_bound(10_000, 200, 170, 1e-4) < epsilon_lower_bound(1000, 200, 170, 1e-4)  # δ·m grows


def test_ceiling_is_the_best_perfect_audit():
    counts = default_guess_counts(1000)
    each = 1 - 0.05 / len(counts)
    ceiling = perfect_guess_ceiling(1000, 1e-5)
    assert ceiling == max(epsilon_lower_bound(1000, r, r, 1e-5, each) for r in counts)
    included = np.arange(1000) % 2 == 0
    assert best_lower_bound(included.astype(float), included, 1e-5).epsilon == ceiling


def test_count_correct_guesses_top_in_and_bottom_out():
    scores = [5.0, 4.0, 3.0, 2.0, 1.0, 0.0]
    included = [True, False, True, False, False, True]
    assert count_correct(scores, included, 2).correct == 1  # top: 5.0 (in: right); bottom: 0.0 (in: wrong)
    assert count_correct(scores, included, 4).correct == 2  # + 4.0 (out: wrong), 1.0 (out: right)
    assert count_correct(scores, included, 3).correct == 1  # two "in" guesses, one "out"


def test_null_mechanism_rarely_reports_leakage():
    """Scores independent of inclusion (an ε = 0 mechanism): the Bonferroni-corrected best bound is
    positive in at most ~5 % of audits (here: 400 audits, at most 32 positive)."""
    rng = np.random.default_rng(7)
    positive = 0
    for _ in range(400):
        included = rng.random(500) < 0.5
        positive += best_lower_bound(rng.normal(size=500), included, 1e-5).epsilon > 0
    assert positive <= 32


def test_best_bound_reports_family_confidence_and_the_guess_count_used():
    rng = np.random.default_rng(0)
    included = rng.random(1000) < 0.5
    bound = best_lower_bound(3.0 * included + rng.normal(size=1000), included, 1e-5)
    assert bound.confidence == 0.95 and bound.tried == default_guess_counts(1000)
    assert bound.guesses in bound.tried and bound.epsilon > 1.5
    each = 1 - 0.05 / len(bound.tried)
    assert bound.epsilon == epsilon_lower_bound(1000, bound.guesses, bound.correct, 1e-5, each)


@pytest.mark.parametrize(
    "call",
    [
        lambda: epsilon_lower_bound(10, 20, 5, 1e-5),
        lambda: epsilon_lower_bound(10, 5, 6, 1e-5),
        lambda: epsilon_lower_bound(10, 5, 3, 1.5),
        lambda: epsilon_lower_bound(10, 5, 3, 1e-5, 1.0),
        lambda: count_correct([1.0, float("nan")], [True, False], 2),
        lambda: count_correct([1.0, 2.0], [True], 2),
        lambda: best_lower_bound([1.0, 2.0], [True, False], 1e-5, guess_counts=[]),
    ],
)
def test_bad_input_is_a_user_error(call):
    with pytest.raises(UserError):
        call()
