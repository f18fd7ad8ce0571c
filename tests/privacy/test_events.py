"""Privacy events: validation, immutability, dict round trip."""

from __future__ import annotations

import dataclasses

import pytest

from privlm.errors import UserError
from privlm.privacy.events import GaussianRelease, PoissonGaussianStep, event_from_dict, hutchinson_probes


@pytest.mark.parametrize(
    "event",
    [
        PoissonGaussianStep(0.01, 1.1),
        PoissonGaussianStep(1.0, 0.7, "hutchinson", 32),
        PoissonGaussianStep(0.2, 2.0, "hutchpp", 96),
        GaussianRelease(12.5),
    ],
)
def test_dict_round_trip_and_hashable(event) -> None:
    assert event_from_dict(event.to_dict()) == event
    assert hash(event_from_dict(event.to_dict())) == hash(event)
    with pytest.raises(dataclasses.FrozenInstanceError):
        event.noise_multiplier = 3.0


def test_envelope_probes() -> None:
    assert PoissonGaussianStep(0.1, 1.0).envelope_probes is None
    assert PoissonGaussianStep(0.1, 1.0, "hutchinson", 7).envelope_probes == 7
    assert PoissonGaussianStep(0.1, 1.0, "hutchpp", 7).envelope_probes == 2
    assert hutchinson_probes("hutchpp", 96) == 32


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(sample_rate=0.0, noise_multiplier=1.0),
        dict(sample_rate=1.5, noise_multiplier=1.0),
        dict(sample_rate=0.1, noise_multiplier=0.0),
        dict(sample_rate=0.1, noise_multiplier=float("inf")),
        dict(sample_rate=0.1, noise_multiplier=1.0, clipping="ghost"),
        dict(sample_rate=0.1, noise_multiplier=1.0, clipping="exact", probes=4),
        dict(sample_rate=0.1, noise_multiplier=1.0, clipping="hutchinson"),
        dict(sample_rate=0.1, noise_multiplier=1.0, clipping="hutchinson", probes=0),
        dict(sample_rate=0.1, noise_multiplier=1.0, clipping="hutchpp", probes=2),
    ],
)
def test_bad_step_raises_user_error(kwargs) -> None:
    with pytest.raises(UserError):
        PoissonGaussianStep(**kwargs)


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "laplace", "scale": 1.0},
        {"noise_multiplier": 1.0},
        {"kind": "gaussian_release", "noise_multiplier": 1.0, "extra": 2},
        {"kind": "gaussian_release", "noise_multiplier": -1.0},
        [1, 2],
    ],
)
def test_malformed_dict_raises_user_error(data) -> None:
    with pytest.raises(UserError):
        event_from_dict(data)
