"""The norm-mode registry: every list of mode names derives from it, and every mode has an estimator."""

from __future__ import annotations

import pytest
import torch

from privlm.audit.registry import DPSGD_MODES
from privlm.dpsgd.norms.factors import ESTIMATORS, OuterFactor, outer_sq_norms
from privlm.errors import UserError
from privlm.names import NORM_MODES as HELP_NAMES
from privlm.norm_modes import (
    AUDITED_MODES,
    CLIPPING_KINDS,
    NORM_MODE_SPECS,
    NORM_MODES,
    RANDOMIZED_MODES,
    check_probes,
    clipping_spec,
    norm_mode,
)
from privlm.privacy.events import PoissonGaussianStep, hutchinson_probes


def test_every_mode_has_exactly_one_estimator():
    assert set(ESTIMATORS) == set(NORM_MODES)


def test_lists_of_names_are_derived():
    assert HELP_NAMES is NORM_MODES
    assert DPSGD_MODES == AUDITED_MODES
    assert CLIPPING_KINDS == ("exact", *RANDOMIZED_MODES)
    assert RANDOMIZED_MODES == ("hutchinson", "hutchpp")
    assert set(AUDITED_MODES) <= set(NORM_MODES)


@pytest.mark.parametrize("name", NORM_MODES)
def test_spec_is_consistent(name):
    spec = norm_mode(name)
    assert spec.name == name
    if spec.randomized:
        assert spec.clipping == name and spec.envelope_probes and spec.probe_columns
        assert spec.envelope_probes(spec.min_probes) >= 1  # the accountant's k is never 0
    else:
        assert spec.clipping == "exact" and spec.envelope_probes is None and spec.probe_columns is None


@pytest.mark.parametrize("name", RANDOMIZED_MODES)
def test_estimator_draws_the_columns_its_spec_declares(name):
    gen = torch.Generator().manual_seed(0)
    factor = OuterFactor(
        torch.randn(3, 5, 7, generator=gen, dtype=torch.float64),
        torch.randn(3, 5, 4, generator=gen, dtype=torch.float64),
        rows=7,
    )
    drawn = []

    def draw(columns, dtype, device):
        drawn.append(columns)
        return torch.randn(7, columns, generator=gen, dtype=dtype)

    probes = 9
    outer_sq_norms([factor], name, probes, draw)
    assert drawn == [NORM_MODE_SPECS[name].probe_columns(probes)]


def test_exact_modes_draw_nothing():
    factor = OuterFactor(torch.randn(2, 3, 4), torch.randn(2, 3, 5), rows=4)

    def draw(*_):
        raise AssertionError("an exact mode drew probes")

    values = [outer_sq_norms([factor], name, 1, draw) for name in NORM_MODES if not norm_mode(name).randomized]
    for v in values[1:]:
        torch.testing.assert_close(v, values[0])


def test_validation_names_the_option_and_value():
    with pytest.raises(UserError, match=r"--norm-mode must be one of .*'hutch'"):
        norm_mode("hutch", "--norm-mode")
    with pytest.raises(UserError, match=r"probes must be an integer >= 3 for norm mode 'hutchpp', got 2"):
        check_probes("hutchpp", 2)
    with pytest.raises(UserError, match="--clipping must be one of"):
        clipping_spec("ghost", "--clipping")


def test_accountant_envelope_comes_from_the_spec():
    assert hutchinson_probes("hutchpp", 96) == NORM_MODE_SPECS["hutchpp"].envelope_probes(96) == 32
    assert PoissonGaussianStep(0.1, 1.0, "hutchinson", 5).envelope_probes == 5
    with pytest.raises(UserError):
        hutchinson_probes("exact", 4)
