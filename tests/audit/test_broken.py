"""The audit catches deliberately broken DP-SGD (fixtures in conftest.py): its lower bound exceeds the
ε the engine accounts — and the same audit of the unbroken mechanism stays below it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privlm.audit.bound import best_lower_bound
from privlm.audit.gradient import AuditModel, GradientCanaries, audit_losses
from privlm.audit.outcome import inclusion_bits
from privlm.audit.training import RunSettings, train_private

DELTA = 1e-5


def _audit(canaries: GradientCanaries, settings: RunSettings, guess_counts=None):
    outcome = canaries.run(settings)
    return best_lower_bound(outcome.scores, outcome.included, DELTA, guess_counts=guess_counts), outcome


# One full-batch step (q = 1) at a claimed ε = 2: σ/2 doubles the Gaussian's μ (0.50 → 1.00); 10,000
# canaries and 500 guesses (fixed in advance) then reach ≈ 2.1–2.6 (20 simulated seeds: mean 2.33, min 2.06).
HALF_NOISE = (GradientCanaries(canaries=10_000, real_examples=0), RunSettings("exact", 2.0, DELTA, 1.0, 1), (500,))


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
    bound, outcome = _audit(GradientCanaries(canaries=500, canary_norm=10.0, real_examples=0),
                            RunSettings(mode, 2.0, DELTA, 0.5, 10))
    assert bound.epsilon > outcome.accounted_epsilon, (bound, outcome.accounted_epsilon)


def _pair_blocks(included: np.ndarray, pairs: int, scale: float) -> tuple[list[dict], int, int]:
    """Block i: canary i (zero gradient, if included), then ``pairs`` pairs ±scale·e_j on coordinates of
    its own. With micro-batches of 2 rows cut by position, block i's pairs share a micro-batch iff an even
    number of canaries up to i was included."""
    m = len(included)
    cols = pairs
    zeros_in, zeros_out = torch.zeros(cols), torch.zeros(m)
    row = {"input_ids": torch.zeros(2, dtype=torch.long), "attention_mask": torch.ones(2, dtype=torch.long),
           "is_canary": torch.tensor(1.0), "loss_offset": torch.tensor(0.0)}
    out = []
    for i in range(m):
        if included[i]:
            out.append({**row, "canary_in": zeros_in, "canary_out": zeros_out})
        for j in range(pairs):
            a, b = torch.zeros(cols), torch.zeros(m)
            a[j], b[i] = 1.0, scale
            out.append({**row, "canary_in": a, "canary_out": b})
            out.append({**row, "canary_in": a, "canary_out": -b})
    return out, m, cols


def _probe_leak_audit(noise_multiplier: float, canaries: int = 48, pairs: int = 32):
    """One full-batch hutchinson (k = 8) step over the pair blocks, micro-batches of 2; each canary is
    scored from the energy of its block and the previous one (split XOR split = included)."""
    included = inclusion_bits(canaries, 3)
    examples, rows, cols = _pair_blocks(included, pairs, scale=2.0)
    model = AuditModel(None, rows, cols)
    settings = RunSettings("hutchinson", None, DELTA, 1.0, 1, probes=8, physical_batch_size=2,
                           noise_multiplier=noise_multiplier)
    run = train_private(model, examples, audit_losses, settings)
    released = -model.canary.weight.detach().double() * run.sample_rate * len(examples)  # clipped sum + noise
    energy = released.pow(2).sum(1).numpy()
    sigma2 = run.noise_multiplier**2
    split_excess = 2 * 0.1063  # E[(X^-1/2 − X'^-1/2)²] for X, X' ~ χ²_8/8: what a split pair leaves
    middle = pairs * (sigma2 + split_excess / 2)
    split = energy > middle
    margin = np.abs(energy - middle)
    before = np.concatenate([[False], split[:-1]])
    confidence = np.minimum(margin, np.concatenate([[np.inf], margin[:-1]]))
    scores = np.where(split ^ before, 1.0, -1.0) * confidence
    return best_lower_bound(scores, included, DELTA)


def test_per_micro_batch_probes_leak_what_the_fix_does_not(per_micro_batch_probes):
    """The pre-fix probes: the audit identifies the (zero-gradient) canaries from the ±e_j pairs their
    presence splits. The leak is C·|X^-1/2 − X'^-1/2| per pair (≈ 0.46·C at k = 8) with a random sign,
    so it stands out only where σ is small; at any σ whose claimed ε the one-run bound could exceed,
    a block would need ~10⁴ pairs (README, "Privacy auditing"): this test shows the leak, not a violation."""
    bound = _probe_leak_audit(noise_multiplier=0.2)
    assert bound.epsilon > 1.0 and bound.correct == bound.guesses, bound  # 48 canaries: at most ≈ 2.6


def test_shared_probes_leave_nothing_to_find():
    """The fixed clipper: a zero-gradient canary changes nothing, so the same audit finds nothing."""
    assert _probe_leak_audit(noise_multiplier=0.2).epsilon == 0.0


def test_all_three_defects_together_are_caught(halved_noise, skipped_clipping, per_micro_batch_probes):
    bound, outcome = _audit(GradientCanaries(canaries=500, canary_norm=10.0, real_examples=0),
                            RunSettings("hutchinson", 2.0, DELTA, 0.5, 10, physical_batch_size=16))
    assert bound.epsilon > outcome.accounted_epsilon, (bound, outcome.accounted_epsilon)
