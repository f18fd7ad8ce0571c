"""White-box gradient canaries: what the score measures, through the real engine."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from privlm.audit.gradient import AuditModel, GradientCanaries, audit_losses
from privlm.audit.training import RunSettings
from privlm.dpsgd.clipping import PerSampleClipper
from privlm.errors import UserError
from privlm.privacy import dpsgd_epsilon
from privlm.randomness import SecureRandom


def _run(mode: str, **kwargs):
    settings = RunSettings(
        norm_mode=mode, epsilon=None, delta=1e-5, sample_rate=1.0, steps=1, noise_multiplier=0.2, probes=8, seed=1
    )
    return GradientCanaries(canaries=400, real_examples=kwargs.pop("real", 0), **kwargs).run(settings)


def test_each_canary_moves_its_own_coordinate_by_c():
    """Exact clipping, one full-batch step, σ = 0.2: an included canary's score is C + N(0, σ²), an
    excluded one's N(0, σ²) — the projection of the update sum onto the canary's direction."""
    outcome = _run("exact")
    inside, outside = outcome.scores[outcome.included], outcome.scores[~outcome.included]
    assert abs(inside.mean() - 1.0) < 0.05 and abs(outside.mean()) < 0.05
    assert abs(outside.std() - 0.2) < 0.03 and abs(inside.std() - 0.2) < 0.03


def test_hutchinson_scales_a_rank_one_canary_by_the_inverse_root_of_a_chi_square():
    """A rank-one canary of norm 2C with k probes contributes min(2C, C/√X), X ~ χ²_k/k (its clip factor
    uses the estimated norm 2C·√X): mean ≈ E[X^-1/2] = 1.108 for k = 8, and far more spread than the
    noise. (The 20 canaries of one row of the 20 × 20 canary layer share that row's probes, hence X:
    the mean averages only 20 draws of X.)"""
    outcome = _run("hutchinson")
    inside = outcome.scores[outcome.included]
    assert abs(inside.mean() - 1.108) < 0.15
    assert inside.std() > 0.3  # sqrt(0.2² + Var X^-1/2 = 0.106) ≈ 0.39; exact clipping gives 0.2


def test_the_lm_trains_alongside_without_touching_the_canary_layer():
    with_lm = _run("exact", real=32)
    without = _run("exact")
    assert with_lm.details["real_examples"] == 32
    assert np.corrcoef(with_lm.scores, without.scores)[0, 1] < 0.9  # different data set, other batches


def test_canary_gradient_is_its_coordinate_alone():
    """Through the library's clipper: a canary row's per-sample gradient is norm·C·e_r e_cᵀ."""
    canaries = GradientCanaries(canaries=6, real_examples=0, canary_norm=3.0)
    settings = RunSettings(norm_mode="exact", epsilon=1.0, delta=1e-5, sample_rate=1.0, steps=1)
    rows, cols = canaries.grid()
    examples = canaries.examples(np.ones(6, dtype=bool), settings, vocab=2, seed=0)
    model = AuditModel(None, rows, cols)
    clipper = PerSampleClipper(
        model, audit_losses, max_grad_norm=100.0, norm_mode="exact", randomness=SecureRandom.from_seed(0, "probes")
    )
    clipper.begin_step(1)
    try:
        batch = {k: torch.stack([e[k] for e in examples[4:5]]) for k in examples[0]}
        clipper.clipped_backward(batch)
    finally:
        clipper.capture.remove()
    grad = clipper.pop_summed_grads()[model.canary.weight]
    expected = torch.zeros(rows, cols)
    expected[4 // cols, 4 % cols] = 3.0
    torch.testing.assert_close(grad, expected)


def test_loss_release_is_accounted_at_the_effective_multiplier():
    """Canaries pinned at the loss bound, loss release on: σ = 1 is drawn and σ/√(1+α²) accounted."""
    settings = RunSettings(
        norm_mode="exact",
        epsilon=None,
        delta=1e-5,
        sample_rate=0.5,
        steps=5,
        loss_noise_fraction=0.2,
        seed=0,
        noise_multiplier=1.0,
    )
    outcome = GradientCanaries(canaries=100, real_examples=0).run(settings)
    q = outcome.details["sample_rate"]
    assert outcome.details["noise_multiplier"] == 1.0
    assert outcome.accounted_epsilon == pytest.approx(dpsgd_epsilon(1.0 / 1.04**0.5, q, 5, 1e-5), rel=1e-8)


@pytest.mark.parametrize("kwargs", [{"canaries": 1}, {"canary_norm": 0.5}])
def test_bad_settings_are_refused(kwargs):
    with pytest.raises(UserError):
        GradientCanaries(real_examples=0, **kwargs).run(
            RunSettings(norm_mode="exact", epsilon=1.0, delta=1e-5, sample_rate=0.5, steps=1)
        )
