"""Private Evolution histogram canaries: they go through PE's own voter, noise and calibration, claim
what PE's ledger reports, reach a GRADMM-sized bound at ε = 8, and catch a broken PE (fixtures in
conftest.py) that its own accounting does not see."""

from __future__ import annotations

import numpy as np
import pytest

from privlm.audit.bound import best_lower_bound
from privlm.audit.pe import PECanaries
from privlm.audit.runner import QUICK, Cell, audit_cell, grid, verdict
from privlm.synthesis.pe.config import PEConfig
from privlm.synthesis.pe.mechanism import noise_multiplier, vote_counts

DELTA = 1e-5


def test_each_canary_votes_once_for_a_bin_of_its_own():
    """Exact votes (no noise) of all canaries: one per canary bin, none elsewhere."""
    canaries = PECanaries(canaries=101, classes=3)
    candidates = canaries.candidates(seed=0)
    index = np.arange(101)
    labels, slots = index % 3, index // 3
    embeddings = np.stack([candidates[y][j] for y, j in zip(labels, slots)])
    counts = np.stack(vote_counts(embeddings, labels, candidates))
    expected = np.zeros_like(counts)
    expected[labels, slots] = 1
    assert (counts == expected).all() and canaries.config.candidates(canaries.per_class()) >= 34


def test_pe_canaries_run_the_librarys_histograms(seeded_os_keys):
    """σ is PE's calibration for T histograms, the claim its ledger's ε; at ε = 20 (σ = 0.58) the scores
    are T + 2σZ in and 2σZ out."""
    canaries = PECanaries(canaries=40, config=PEConfig(iterations=4))
    outcome = canaries.run(epsilon=20.0, delta=DELTA)
    details = outcome.details
    assert details["iterations"] == 4 and details["candidates_per_class"] == 20 and details["per_class"] == 10
    assert details["noise_multiplier"] == noise_multiplier(20.0, DELTA, canaries.config, 2, 10)
    assert 19.5 < outcome.accounted_epsilon <= 20.0
    inside, outside = outcome.scores[outcome.included], outcome.scores[~outcome.included]
    assert abs(inside.mean() - 4) < 1 and abs(outside.mean()) < 1 and outcome.scores.std() < 3


def test_pe_audit_reaches_a_real_bound_below_the_claim(seeded_os_keys):
    """1,000 canaries at ε = 8 (T = 3, σ = 1.04: the composed μ = √3/σ of GRADMM's σ = 0.60)."""
    outcome = PECanaries(canaries=1000).run(epsilon=8.0, delta=DELTA)
    bound = best_lower_bound(outcome.scores, outcome.included, DELTA)
    assert 2.0 <= bound.epsilon <= outcome.accounted_epsilon, bound


def test_the_grid_has_pe_cells():
    row = verdict(audit_cell(Cell("pe", "histograms", 4.0), QUICK, DELTA, 0), 1)
    assert row["canaries"] == 64 and not row["violation"] and row["run_iterations"] == 3
    assert grid(["pe"], None, [1, 4, 8]) == [Cell("pe", "histograms", e) for e in (1.0, 4.0, 8.0)]


# A claimed ε = 2 (T = 3, σ = 3.45): a broken PE doubles the composed μ (0.50 → 1.00). 50,000 canaries
# (2 s) and 1,000 guesses fixed in advance: simulated Gaussians of the broken μ give 2.44–2.85 over 8
# seeds, the unbroken 1.08–1.34.
BROKEN = (PECanaries(canaries=50_000), 2.0, (1000,))


@pytest.mark.parametrize("defect", ["pe_halved_noise", "pe_double_votes"])
def test_broken_pe_is_caught(defect, seeded_os_keys, request):
    request.getfixturevalue(defect)
    canaries, epsilon, counts = BROKEN
    outcome = canaries.run(epsilon, DELTA)
    bound = best_lower_bound(outcome.scores, outcome.included, DELTA, guess_counts=counts)
    assert bound.epsilon > outcome.accounted_epsilon, (bound, outcome.accounted_epsilon)


def test_the_same_audit_passes_the_unbroken_pe(seeded_os_keys):
    canaries, epsilon, counts = BROKEN
    outcome = canaries.run(epsilon, DELTA)
    bound = best_lower_bound(outcome.scores, outcome.included, DELTA, guess_counts=counts)
    assert 0.8 < bound.epsilon < outcome.accounted_epsilon, (bound, outcome.accounted_epsilon)
