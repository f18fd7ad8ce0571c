"""One-shot Gaussian calibration against dp-accounting's PLD and the definition of the analytic mechanism."""

from __future__ import annotations

import math

import pytest
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.pld.privacy_loss_mechanism import GaussianPrivacyLoss

from privlm.errors import UserError
from privlm.privacy.gaussian import gaussian_delta, gaussian_epsilon, gaussian_noise_multiplier

CASES = [(0.05, 1e-5), (0.5, 1e-6), (1.0, 1e-5), (3.0, 1e-8), (8.0, 1e-3)]


@pytest.mark.parametrize("epsilon, delta", CASES)
def test_noise_multiplier_is_smallest_that_meets_target(epsilon: float, delta: float) -> None:
    sigma = gaussian_noise_multiplier(epsilon, delta)
    assert gaussian_delta(sigma, epsilon) <= delta
    assert gaussian_delta(sigma * (1 - 1e-6), epsilon) > delta


@pytest.mark.parametrize("epsilon, delta", CASES)
def test_agrees_with_dp_accounting_pld(epsilon: float, delta: float) -> None:
    sigma = gaussian_noise_multiplier(epsilon, delta)
    pld_epsilon = pld_lib.from_gaussian_mechanism(sigma, value_discretization_interval=1e-4).get_epsilon_for_delta(
        delta
    )
    assert epsilon - 1e-9 <= pld_epsilon <= epsilon + 2e-3  # the PLD is pessimistic: never below the exact value
    reference = GaussianPrivacyLoss(sigma).get_delta_for_epsilon(epsilon)
    assert gaussian_delta(sigma, epsilon) == pytest.approx(reference, rel=1e-9)


@pytest.mark.parametrize("epsilon, delta", [(0.05, 1e-5), (0.5, 1e-6), (0.9, 1e-5)])
def test_tighter_than_classic_bound(epsilon: float, delta: float) -> None:
    classic = math.sqrt(2 * math.log(1.25 / delta)) / epsilon
    assert gaussian_noise_multiplier(epsilon, delta) < classic


@pytest.mark.parametrize("sigma, delta", [(0.8, 1e-5), (4.0, 1e-6), (60.0, 1e-5)])
def test_epsilon_round_trip(sigma: float, delta: float) -> None:
    epsilon = gaussian_epsilon(sigma, delta)
    assert gaussian_delta(sigma, epsilon) <= delta
    assert gaussian_delta(sigma, epsilon * (1 - 1e-6)) > delta
    assert gaussian_noise_multiplier(epsilon, delta) == pytest.approx(sigma, rel=1e-6)


@pytest.mark.parametrize(
    "call",
    [
        lambda: gaussian_noise_multiplier(0.0, 1e-5),
        lambda: gaussian_noise_multiplier(-1.0, 1e-5),
        lambda: gaussian_noise_multiplier(1.0, 0.0),
        lambda: gaussian_noise_multiplier(1.0, 1.0),
        lambda: gaussian_epsilon(0.0, 1e-5),
        lambda: gaussian_epsilon(1.0, 1.5),
    ],
)
def test_bad_input_raises_user_error(call) -> None:
    with pytest.raises(UserError):
        call()
