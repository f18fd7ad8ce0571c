"""The audit catches deliberately broken DP-SGD (fixtures in conftest.py): its lower bound exceeds the
ε the engine accounts — and the same audit of the unbroken mechanism stays below it."""

from __future__ import annotations

import pytest

from privlm.audit.bound import best_lower_bound
from privlm.audit.gradient import GradientCanaries
from privlm.audit.shift import ShiftCanaries
from privlm.audit.training import RunSettings

DELTA = 1e-5


def _audit(
    canaries: GradientCanaries | ShiftCanaries, settings: RunSettings, guess_counts: tuple[int, ...] | None = None
):
    outcome = canaries.run(settings)
    return best_lower_bound(outcome.scores, outcome.included, outcome.delta, guess_counts=guess_counts), outcome


# One full-batch step (q = 1) at a claimed ε = 2: σ/2 doubles the Gaussian's μ (0.50 → 1.00); 10,000
# canaries and 500 guesses (fixed in advance) then reach ≈ 2.1–2.6 (20 simulated seeds: mean 2.33, min 2.06).
HALF_NOISE = (
    GradientCanaries(canaries=10_000, real_examples=0),
    RunSettings(norm_mode="exact", epsilon=2.0, delta=DELTA, sample_rate=1.0, steps=1),
    (500,),
)


def test_halved_noise_is_caught(halved_noise):
    canaries, settings, counts = HALF_NOISE
    bound, outcome = _audit(canaries, settings, counts)
    assert bound.epsilon > outcome.accounted_epsilon, (bound, outcome.accounted_epsilon)


def test_the_same_audit_passes_the_unbroken_mechanism():
    canaries, settings, counts = HALF_NOISE
    bound, outcome = _audit(canaries, settings, counts)
    assert 0.5 < bound.epsilon < outcome.accounted_epsilon


@pytest.mark.parametrize("mode", ["exact", "hutchinson"])
def test_skipped_clipping_is_caught(skipped_clipping, mode):
    """Canaries of norm 10·C, left unclipped, move their coordinate ten times what is accounted."""
    bound, outcome = _audit(
        GradientCanaries(canaries=500, canary_norm=10.0, real_examples=0),
        RunSettings(norm_mode=mode, epsilon=2.0, delta=DELTA, sample_rate=0.5, steps=10),
    )
    assert bound.epsilon > outcome.accounted_epsilon, (bound, outcome.accounted_epsilon)


# Shift canaries (privlm.audit.shift): 128 zero-gradient canaries, each followed by 8 runs of 240 rows of
# ±100·C gradients, one full-batch hutchinson (k = 8) step in micro-batches of 2 (≈ 246,000 rows), claimed
# ε = 2 at δ = 1e-4: σ = 3.13 (4.3 at δ = 1e-5, where the k = 8 envelope's tail dominates; m·δ = 0.013
# costs the bound almost nothing), 64 guesses fixed in advance. Seed 0: 63 of 64 right, bound 2.54 (the
# fixed clipper: 37 of 64, bound 0).
SHIFT = (
    ShiftCanaries(canaries=128, columns=8, run_length=120),
    RunSettings(
        norm_mode="hutchinson", epsilon=2.0, delta=1e-4, sample_rate=1.0, steps=1, probes=8, physical_batch_size=2
    ),
    (64,),
)
# The same design at CI size: σ = 0.5 given (no claim worth exceeding), 32 canaries, 16 guesses.
SHIFT_SMALL = (
    ShiftCanaries(canaries=32, columns=4, run_length=10),
    RunSettings(
        norm_mode="hutchinson",
        epsilon=None,
        delta=1e-4,
        sample_rate=1.0,
        steps=1,
        probes=8,
        physical_batch_size=2,
        noise_multiplier=0.5,
    ),
    (16,),
)


@pytest.mark.long
def test_per_micro_batch_probes_are_caught(per_micro_batch_probes):
    """The pre-fix probes: a zero-gradient canary moves the micro-batch cut of every later row, so the
    ±e pairs behind it stop cancelling; its audited lower bound exceeds the claimed ε (minutes: ``make test-long``)."""
    bound, outcome = _audit(*SHIFT)
    assert bound.epsilon > outcome.accounted_epsilon, (bound, outcome.accounted_epsilon)


@pytest.mark.long
def test_the_same_shift_audit_passes_per_step_probes():
    """privlm's clipper on the same canaries: every pair cancels whatever the cut, nothing to find."""
    bound, outcome = _audit(*SHIFT)
    assert bound.epsilon <= outcome.accounted_epsilon, (bound, outcome.accounted_epsilon)


def test_per_micro_batch_probes_show_at_small_noise(per_micro_batch_probes):
    bound, _ = _audit(*SHIFT_SMALL)
    assert bound.correct == bound.guesses and bound.epsilon > 1.0, bound


def test_per_step_probes_show_nothing_at_small_noise():
    bound, _ = _audit(*SHIFT_SMALL)
    assert bound.epsilon == 0.0, bound


def test_all_three_defects_together_are_caught(halved_noise, skipped_clipping, per_micro_batch_probes):
    bound, outcome = _audit(
        GradientCanaries(canaries=500, canary_norm=10.0, real_examples=0),
        RunSettings(
            norm_mode="hutchinson", epsilon=2.0, delta=DELTA, sample_rate=0.5, steps=10, physical_batch_size=16
        ),
    )
    assert bound.epsilon > outcome.accounted_epsilon, (bound, outcome.accounted_epsilon)
