"""Snapping (:mod:`privlm.privacy.snapping`): the grid, the clamp, exactness in float32, the accounted
slack, and the precision attack it closes (an output impossible under one input and possible under
the other, measured before on unsnapped float32 sums)."""

from __future__ import annotations

import math

import pytest
import torch

from privlm.privacy.accountant import PrivacyAccountant
from privlm.privacy.events import GaussianRelease, PoissonGaussianStep
from privlm.privacy.gaussian import gaussian_delta, gaussian_noise_multiplier
from privlm.privacy.snapping import LOG_RATIO_PER_COORDINATE, grid, snap, snapped_guarantee
from privlm.randomness import SecureRandom


@pytest.mark.parametrize("std", [0.3, 1.0, 3.7, 1000.0])
def test_grid_and_clamp_bracket_the_noise_std(std):
    step, bound = grid(std)
    assert std / 512 < step <= std / 256 and 128 * std < bound <= 256 * std
    assert math.log2(step).is_integer() and math.log2(bound).is_integer()
    x = torch.tensor([0.0, std * 1.2345678901, -bound * 3, bound * 3, step * 0.49, step * 0.51], dtype=torch.float64)
    y = snap(x.clone(), std)
    assert torch.equal(y / step, (y / step).round())  # on the grid
    assert y[2] == -bound and y[3] == bound and y[4] == 0 and y[5] == step
    assert torch.equal(y.float().double(), y)  # exact in float32
    assert (y - x)[:2].abs().max() <= step / 2


def test_snap_needs_float64_and_positive_std():
    with pytest.raises(TypeError):
        snap(torch.zeros(2), 1.0)
    with pytest.raises(ValueError):
        grid(0.0)


def _outputs(x: float, draws: int, key: int, snapped: bool) -> set[float]:
    """The float32 releases of x + N(0, 1) (σC = 1), unsnapped as before or snapped."""
    z = SecureRandom.from_seed(key, "attack").normal((draws,), (0,), dtype=torch.float64)
    if snapped:
        return set(snap(x + z, 1.0).float().tolist())
    return set((torch.tensor(x, dtype=torch.float32) + z.float()).tolist())


def test_the_precision_attack_finds_no_impossible_output_after_snapping():
    """x = 3.0 vs x′ = 2.5 (the review's construction): unsnapped, outputs near 0 reveal which input
    made them (y − x must be a representable float32); snapped, every output of x′ is also an output of x
    given enough draws (same grid under both)."""
    draws = 400_000
    b = _outputs(2.5, draws, 2, False)
    # Under x = 3, an output y in (0.5, 1) is 3 + f exactly (Sterbenz) with f in [−2.5, −2], a multiple of
    # 2⁻²² in float32: odd multiples of 2⁻²³ there are impossible. Under x′ = 2.5 (f′ in [−2, −1.5]) they occur.
    impossible = [y for y in b if 0.5 < y < 1 and not (y * 2**22).is_integer()]
    assert len(impossible) > draws * 0.01  # the attack works without snapping (measured: ≈ 2 % of outputs)
    step, _ = grid(1.0)
    snapped_a, snapped_b = _outputs(3.0, draws, 1, True), _outputs(2.5, draws, 2, True)
    assert all(((y / step).is_integer()) for y in snapped_a | snapped_b)
    near = {y for y in snapped_b if abs(y - 2.75) < 1.0}  # where both inputs put plenty of mass
    assert near <= snapped_a


def test_the_accountant_adds_the_snapping_slack():
    plain, snapped = PrivacyAccountant(), PrivacyAccountant()
    plain.record(GaussianRelease(2.0))
    snapped.record(GaussianRelease(2.0, snapped=10**6))
    eta = 10**6 * LOG_RATIO_PER_COORDINATE
    expected = PrivacyAccountant()
    expected.record(GaussianRelease(2.0))
    ideal = expected.epsilon(1e-5 * math.exp(-eta))
    assert snapped.epsilon(1e-5) == pytest.approx(ideal + 2 * eta, rel=1e-12)
    assert snapped.epsilon(1e-5) > plain.epsilon(1e-5)
    assert snapped_guarantee(1.0, 1e-5, 10**6) == (1.0 + 2 * eta, math.exp(eta) * 1e-5)
    step = PoissonGaussianStep(0.01, 1.0, snapped=1)
    assert PoissonGaussianStep.__name__ and step.to_dict()["snapped"] == 1


def test_calibration_for_a_snapped_release_meets_epsilon_with_the_slack():
    coordinates = 2 * 49152 * 576  # the full-head release of SmolLM2, two classes
    sigma = gaussian_noise_multiplier(1.0, 1e-5, snapped=coordinates)
    assert sigma > gaussian_noise_multiplier(1.0, 1e-5)
    accountant = PrivacyAccountant()
    accountant.record(GaussianRelease(sigma, snapped=coordinates))
    assert accountant.epsilon(1e-5) <= 1.0 + 1e-3  # the PLD's pessimistic discretisation on top
    eta = coordinates * LOG_RATIO_PER_COORDINATE
    assert gaussian_delta(sigma, 1.0 - 2 * eta) <= 1e-5 * math.exp(-eta) * (1 + 1e-9)
