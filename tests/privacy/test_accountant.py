"""Accountant for exact clipping and Gaussian releases, against Opacus' vectors, dp-accounting and prv-accountant."""

from __future__ import annotations

import itertools
import warnings

import dp_accounting
import pytest
from prv_accountant import PoissonSubsampledGaussianMechanism, PRVAccountant

from privlm.errors import UserError
from privlm.privacy.accountant import PrivacyAccountant
from privlm.privacy.events import GaussianRelease, PoissonGaussianStep

STEP = 1e-3  # PLD discretization used in the fast cross-checks


def _epsilon(method: str, sigma: float, q: float, steps: int, delta: float, step: float = 1e-4) -> float:
    accountant = PrivacyAccountant(method, value_discretization=step)
    accountant.record(PoissonGaussianStep(q, sigma), steps)
    return accountant.epsilon(delta)


def test_opacus_reference_values() -> None:
    """σ=1.5, q=0.04, 2,250 steps, δ=1e-5: PRV/PLD 6.7774 and RDP 7.3291 (Opacus' test vectors)."""
    assert _epsilon("pld", 1.5, 0.04, 2250, 1e-5) == pytest.approx(6.7774, rel=5e-3)
    assert _epsilon("rdp", 1.5, 0.04, 2250, 1e-5) == pytest.approx(7.3291, rel=5e-3)


def test_matches_dp_accounting_used_directly() -> None:
    ours = PrivacyAccountant(value_discretization=STEP)
    ours.record(PoissonGaussianStep(0.02, 1.1), 300)
    ours.record(GaussianRelease(8.0), 3)
    ours.record(PoissonGaussianStep(0.05, 2.0), 40)
    reference = dp_accounting.pld.PLDAccountant(value_discretization_interval=STEP)
    gaussian = dp_accounting.GaussianDpEvent
    reference.compose(dp_accounting.PoissonSampledDpEvent(0.02, gaussian(1.1)), 300)
    reference.compose(gaussian(8.0), 3)
    reference.compose(dp_accounting.PoissonSampledDpEvent(0.05, gaussian(2.0)), 40)
    for delta in (1e-5, 1e-8):
        assert ours.epsilon(delta) == pytest.approx(reference.get_epsilon(delta), rel=1e-4)
    for epsilon in (0.5, 2.0):
        assert ours.delta(epsilon) == pytest.approx(reference.get_delta(epsilon), rel=1e-4, abs=1e-15)


def test_rdp_matches_dp_accounting_and_is_looser() -> None:
    reference = dp_accounting.rdp.RdpAccountant()
    reference.compose(dp_accounting.PoissonSampledDpEvent(0.01, dp_accounting.GaussianDpEvent(0.9)), 1000)
    rdp = _epsilon("rdp", 0.9, 0.01, 1000, 1e-6)
    assert rdp == pytest.approx(reference.get_epsilon(1e-6), rel=1e-9)
    assert rdp > _epsilon("pld", 0.9, 0.01, 1000, 1e-6, STEP)


def test_recording_one_at_a_time_equals_recording_a_count() -> None:
    one_by_one = PrivacyAccountant(value_discretization=STEP)
    for _ in range(50):
        one_by_one.record(PoissonGaussianStep(0.1, 1.0))
    assert one_by_one.events == ((PoissonGaussianStep(0.1, 1.0), 50),)
    assert one_by_one.epsilon(1e-5) == _epsilon("pld", 1.0, 0.1, 50, 1e-5, STEP)


def test_epsilon_and_delta_are_inverse() -> None:
    accountant = PrivacyAccountant(value_discretization=STEP)
    accountant.record(PoissonGaussianStep(0.03, 1.3), 500)
    epsilon = accountant.epsilon(1e-6)
    assert accountant.delta(epsilon) <= 1e-6 * (1 + 1e-9)
    assert accountant.delta(epsilon - 5 * STEP) > 1e-6
    assert PrivacyAccountant().epsilon(1e-5) == 0.0


# 24 (σ, q, steps, δ) cases; ε stays below ~10, where prv-accountant's bounds are reliable.
PRV_CASES = [
    (sigma, q, steps, (1e-5, 1e-7, 1e-6)[n % 3])
    for n, (sigma, q, steps) in enumerate(itertools.product([0.8, 1.2, 2.0, 4.0], [0.005, 0.03, 0.1], [20, 150]))
    if not (sigma == 0.8 and q == 0.1 and steps == 150)
] + [(0.8, 0.1, 60, 1e-6)]


@pytest.mark.parametrize("sigma, q, steps, delta", PRV_CASES)
def test_never_below_prv_accountant(sigma: float, q: float, steps: int, delta: float) -> None:
    """Our PLD ε is an upper bound: never below prv-accountant's lower bound by more than our
    discretization step, and not above its upper bound by more than 1% (add adjacency can cost a bit more
    than the remove-only PRV)."""
    eps_error = 0.01
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prv = PRVAccountant(
            [PoissonSubsampledGaussianMechanism(sampling_probability=q, noise_multiplier=sigma)],
            eps_error=eps_error,
            delta_error=delta / 1000,
            max_self_compositions=[steps],
        )
        lower, _, upper = prv.compute_epsilon(delta, [steps])
    ours = _epsilon("pld", sigma, q, steps, delta, STEP)
    assert ours >= lower - STEP
    assert ours <= upper * 1.01 + STEP


def test_rdp_refuses_randomized_clipping() -> None:
    with pytest.raises(UserError, match="RDP"):
        PrivacyAccountant("rdp").record(PoissonGaussianStep(0.01, 1.0, "hutchinson", 32))


@pytest.mark.parametrize(
    "call",
    [
        lambda: PrivacyAccountant("moments"),
        lambda: PrivacyAccountant(value_discretization=0.0),
        lambda: PrivacyAccountant().record(PoissonGaussianStep(0.1, 1.0), 0),
        lambda: PrivacyAccountant().record("step"),
        lambda: PrivacyAccountant().epsilon(0.0),
        lambda: PrivacyAccountant().epsilon(1.0),
        lambda: PrivacyAccountant().delta(-1.0),
    ],
)
def test_bad_input_raises_user_error(call) -> None:
    with pytest.raises(UserError):
        call()
