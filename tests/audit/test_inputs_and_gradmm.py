"""Black-box input canaries and GRADMM release canaries: they run the library's mechanisms, claim
what the library's accountants say, and score what the auditor can see."""

from __future__ import annotations

import numpy as np
import pytest

from privlm.audit.gradmm import GradmmCanaries
from privlm.audit.inputs import InputCanaries
from privlm.audit.training import RunSettings
from privlm.errors import UserError
from privlm.privacy.gaussian import gaussian_noise_multiplier


def test_input_canaries_with_little_noise_are_found():
    """σ = 0.2 on a tiny Llama: trained canaries' losses fall more than untrained ones'."""
    settings = RunSettings("exact", None, 1e-5, 0.5, 5, noise_multiplier=0.2, seed=0)
    outcome = InputCanaries(canaries=64).run(settings)
    assert outcome.scores[outcome.included].mean() > outcome.scores[~outcome.included].mean() + 0.05
    assert outcome.details["steps"] == 5 and np.isfinite(outcome.accounted_epsilon)


def test_input_canaries_are_refused_when_too_few():
    with pytest.raises(UserError):
        InputCanaries(canaries=1).run(RunSettings("exact", 1.0, 1e-5, 0.5, 1))


@pytest.mark.parametrize("release", ["label-rows", "full"])
def test_gradmm_canaries_audit_the_librarys_release(release):
    """The release is the library's draw_release at the calibrated σ; the claim is its exact ε."""
    outcome = GradmmCanaries(canaries=16, release=release).run(epsilon=20.0, delta=1e-5)
    assert outcome.details["noise_multiplier"] == gaussian_noise_multiplier(20.0, 1e-5)
    assert outcome.accounted_epsilon == pytest.approx(20.0, rel=1e-6)
    assert outcome.scores.shape == (16,) and np.isfinite(outcome.scores).all()
    # at ε = 20 the noise is small against one clipped gradient: included canaries score higher
    assert outcome.scores[outcome.included].mean() > outcome.scores[~outcome.included].mean()
