"""Black-box input canaries and GRADMM release canaries: they run the library's mechanisms, claim
what the library's accountants say, and score what the auditor can see."""

from __future__ import annotations

import numpy as np
import pytest

from privlm.audit.bound import best_lower_bound
from privlm.audit.gradmm import GradmmCanaries
from privlm.audit.inputs import InputCanaries
from privlm.audit.training import RunSettings
from privlm.errors import UserError
from privlm.privacy.gaussian import gaussian_noise_multiplier


def test_input_canaries_with_little_noise_are_found():
    """σ = 0.2 on a tiny Llama: trained canaries' losses fall more than untrained ones'."""
    settings = RunSettings(
        norm_mode="exact", epsilon=None, delta=1e-5, sample_rate=0.5, steps=5, noise_multiplier=0.2, seed=0
    )
    outcome = InputCanaries(canaries=64).run(settings)
    assert outcome.scores[outcome.included].mean() > outcome.scores[~outcome.included].mean() + 0.05
    assert outcome.details["steps"] == 5 and np.isfinite(outcome.accounted_epsilon)


def test_input_canaries_are_refused_when_too_few():
    with pytest.raises(UserError):
        InputCanaries(canaries=1).run(RunSettings(norm_mode="exact", epsilon=1.0, delta=1e-5, sample_rate=0.5, steps=1))


@pytest.mark.parametrize("release", ["label-rows", "full"])
def test_gradmm_canaries_audit_the_librarys_release(release, seeded_os_keys):
    """The release is the library's draw_release at the calibrated σ; the claim is its exact ε; every
    canary is clipped (gradient norm ≥ C) and moves its own direction by C."""
    outcome = GradmmCanaries(canaries=16, release=release).run(epsilon=20.0, delta=1e-5)
    assert 1 <= outcome.details["noise_multiplier"] / gaussian_noise_multiplier(20.0, 1e-5) < 1.002
    assert outcome.accounted_epsilon <= 20.0 and outcome.accounted_epsilon == pytest.approx(20.0, rel=2e-3)
    assert outcome.details["hidden_size"] == 8 and outcome.details["smallest_gradient_norm"] >= 1.0
    assert outcome.scores.shape == (16,) and np.isfinite(outcome.scores).all()
    # at ε = 20, σ = 0.23: included canaries score ≈ 1, excluded ≈ 0
    assert np.abs(outcome.scores - outcome.included).max() < 1.2


@pytest.mark.parametrize("release", ["label-rows", "full"])
def test_gradmm_canaries_reach_a_real_bound_below_the_claim(release, seeded_os_keys):
    """1,000 orthogonal canaries at ε = 8 (σ = 0.60): a bound of the DP-SGD white-box order, below ε."""
    outcome = GradmmCanaries(canaries=1000, release=release).run(epsilon=8.0, delta=1e-5)
    bound = best_lower_bound(outcome.scores, outcome.included, outcome.delta)
    assert 2.0 <= bound.epsilon <= outcome.accounted_epsilon, bound


@pytest.mark.slow
def test_input_canaries_train_smollm2_lora_adapters():
    """The SmolLM2 black-box cell at a smoke size: LoRA on the last 2 blocks, one step."""
    settings = RunSettings(
        norm_mode="exact", epsilon=8.0, delta=1e-5, sample_rate=0.5, steps=1, physical_batch_size=16, seed=0
    )
    outcome = InputCanaries(canaries=16, model="smollm2-135m", lora_rank=8, lora_layers=2).run(settings)
    assert outcome.scores.shape == (16,) and np.isfinite(outcome.scores).all()
    assert outcome.details["model"] == "smollm2-135m" and outcome.accounted_epsilon <= 8.0 + 1e-9
