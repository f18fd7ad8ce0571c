"""``privlm account``: ε and σ per clipping kind, JSON output, exit code 2 on bad input."""

from __future__ import annotations

import json

import dp_accounting
import pytest

from privlm.cli import main
from privlm.privacy.calibration import dpsgd_epsilon

BASE = ["account", "--sample-rate", "0.02", "--steps", "200", "--delta", "1e-5"]


def _run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(args)
        raise SystemExit(0)
    captured = capsys.readouterr()
    return info.value.code or 0, captured.out, captured.err


def test_epsilon_json_single_kind_matches_dp_accounting(capsys) -> None:
    code, out, _ = _run(BASE + ["--noise-multiplier", "1.1", "--clipping", "exact", "--json"], capsys)
    assert code == 0
    payload = json.loads(out)
    reference = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    reference.compose(dp_accounting.PoissonSampledDpEvent(0.02, dp_accounting.GaussianDpEvent(1.1)), 200)
    assert payload["epsilon"] == pytest.approx(reference.get_epsilon(1e-5), rel=1e-4)


def test_side_by_side_json_has_every_kind(capsys) -> None:
    code, out, _ = _run(BASE + ["--noise-multiplier", "1.1", "--probes", "48", "--json"], capsys)
    assert code == 0
    epsilon = json.loads(out)["epsilon"]
    assert set(epsilon) == {"exact", "hutchinson", "hutchpp"}
    assert epsilon["exact"] < epsilon["hutchinson"] < epsilon["hutchpp"]  # k = 48 vs k = 16 for hutchpp
    assert epsilon["hutchpp"] == pytest.approx(dpsgd_epsilon(1.1, 0.02, 200, 1e-5, "hutchinson", 16), rel=1e-12)


def test_target_epsilon_prints_calibrated_sigma(capsys) -> None:
    code, out, _ = _run(
        BASE + ["--target-epsilon", "2.0", "--clipping", "hutchinson", "--probes", "64", "--json"], capsys
    )
    assert code == 0
    sigma = json.loads(out)["noise_multiplier"]
    assert dpsgd_epsilon(sigma, 0.02, 200, 1e-5, "hutchinson", 64) <= 2.0
    assert dpsgd_epsilon(sigma / 1.001, 0.02, 200, 1e-5, "hutchinson", 64) > 2.0


def test_table_shows_ratio_to_exact(capsys) -> None:
    code, out, _ = _run(BASE + ["--noise-multiplier", "1.1", "--probes", "96"], capsys)
    assert code == 0
    assert "ratio to exact" in out and "hutchpp" in out and "ε" in out


@pytest.mark.parametrize(
    "extra, needle",
    [
        (["--target-epsilon", "0"], "--target-epsilon"),
        (["--target-epsilon", "-1"], "--target-epsilon"),
        (["--noise-multiplier", "1", "--delta", "1"], "--delta"),
        (["--noise-multiplier", "1", "--delta", "0"], "--delta"),
        (["--noise-multiplier", "1", "--sample-rate", "0"], "--sample-rate"),
        (["--noise-multiplier", "1", "--sample-rate", "1.5"], "--sample-rate"),
        (["--noise-multiplier", "1", "--steps", "0"], "--steps"),
        (["--noise-multiplier", "1", "--probes", "0"], "--probes"),
        (["--noise-multiplier", "1", "--clipping", "ghost"], "--clipping"),
        (["--noise-multiplier", "1", "--clipping", "exact", "--probes", "8"], "--probes"),
        (["--noise-multiplier", "1", "--clipping", "hutchpp", "--probes", "2"], "hutchpp"),
        (["--noise-multiplier", "1", "--method", "rdp"], "rdp"),
        ([], "exactly one"),
        (["--noise-multiplier", "1", "--target-epsilon", "1"], "exactly one"),
    ],
)
def test_bad_input_exits_2_with_reason(extra: list[str], needle: str, capsys) -> None:
    code, out, err = _run(BASE + extra, capsys)
    assert code == 2
    assert out == ""
    assert needle in err and len(err.strip().splitlines()) == 1


def test_unbounded_epsilon_is_strict_json(capsys) -> None:
    """k = 1 probe at σ = 0.5: the random sensitivity's tail makes ε unbounded at this δ."""
    args = BASE + ["--noise-multiplier", "0.5", "--clipping", "hutchinson", "--probes", "1", "--json"]
    code, out, _ = _run(args, capsys)
    assert code == 0
    assert (
        json.loads(out, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))["epsilon"]
        == "inf"
    )
