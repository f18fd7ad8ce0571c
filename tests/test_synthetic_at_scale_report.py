"""The study report's reading of a target gap (``research/synthetic_at_scale/report.py: resolution``): its 95 %
interval is Welch's, checked against the Welch–Satterthwaite formula written out here, and the verdict follows
the interval's side of the threshold."""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path
from types import ModuleType

import pytest
from scipy.stats import t as student_t

SCRIPT = Path(__file__).resolve().parents[1] / "research" / "synthetic_at_scale" / "report.py"


@pytest.fixture(scope="module")
def report(research_script) -> ModuleType:
    return research_script("synthetic_at_scale/report.py")


def _welch(a: list[float], b: list[float]) -> tuple[float, float]:
    va, vb = statistics.variance(a) / len(a), statistics.variance(b) / len(b)
    df = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    half = student_t.ppf(0.975, df) * math.sqrt(va + vb)
    gap = statistics.mean(a) - statistics.mean(b)
    return gap - half, gap + half


def _interval(text: str) -> tuple[float, float]:
    found = re.search(r"\[([+-][\d.]+), ([+-][\d.]+)\]", text)
    assert found, text
    return float(found[1]), float(found[2])


def test_the_interval_is_welchs(report: ModuleType) -> None:
    a, b = [80.5, 81.9, 78.3], [82.3, 80.9, 83.8]
    low, high = _welch(a, b)
    assert _interval(report.resolution(a, b, -2)) == pytest.approx((round(low, 1), round(high, 1)), abs=0.051)
    assert low < statistics.mean(a) - statistics.mean(b) < high


@pytest.mark.parametrize(
    ("values", "threshold", "verdict"),
    [
        ([90.0, 90.5, 91.0], -2, "above it: resolved"),
        ([70.0, 70.5, 71.0], -2, "below it: resolved"),
        ([80.5, 81.9, 78.3], -2, "across it"),
    ],
)
def test_the_verdict_follows_the_side_of_the_threshold(
    report: ModuleType, values: list[float], threshold: float, verdict: str
) -> None:
    assert verdict in report.resolution(values, [82.3, 80.9, 83.8], threshold)


def test_one_seed_has_no_interval(report: ModuleType) -> None:
    assert report.resolution([80.0], [82.3, 80.9, 83.8], -2) == ""
    assert report.resolution([80.0, 81.0], [82.3], 3) == ""


def test_no_spread_between_seeds_gives_no_interval(report: ModuleType) -> None:
    assert report.resolution([81.0, 81.0], [82.0, 82.0], -2) == ""


def _row(method: str, eps: float | None, seed: int, head: float, tune: float) -> dict:
    return {"method": method, "epsilon": eps, "n_per_class": 1000, "seed": seed, "cell": f"{method}_{seed}"} | {
        "head_accuracy": head / 100,
        "accuracy": tune / 100,
    }


def test_targets_read_the_best_dp_set_against_dp_training_and_its_control(report: ModuleType) -> None:
    """Percent scale, the right thresholds (−2 against DP training directly, +3 against the control) and the
    right lists on each side of each interval, on made-up rows."""
    best, control = [78.0, 79.0, 80.0], [74.0, 75.5, 76.0]
    rows = [_row("dp-head-pool", 1.0, s, h, h + 3) for s, h in enumerate(best)]
    rows += [_row("instruct-pool", None, s, h, h + 3) for s, h in enumerate(control)]
    rows += [_row("gradmm@instruct", 1.0, s, 60.0 + s, 70.0) for s in range(3)]
    direct = [82.0, 81.0, 83.0]
    lines = report.targets(report.grouped(rows), {1.0: direct})
    head = next(line for line in lines if line.startswith("- head-only: best DP set"))
    assert "dp-head-pool 79.0 (3 seed(s))" in head and "= -3.0 points (target ≥ −2): missed by 1.0" in head
    assert _interval(head) == pytest.approx(tuple(round(x, 1) for x in _welch(best, direct)), abs=0.051)
    margin = next(line for line in lines if line.startswith("- head-only: dp-head-pool − its control"))
    assert "= +3.8 points (target ≥ +3): met" in margin and "across it" in margin  # [+1.5, +6.1]: above −2
    assert _interval(margin) == pytest.approx(tuple(round(x, 1) for x in _welch(best, control)), abs=0.051)
    tune = next(line for line in lines if line.startswith("- fine-tune: best DP set"))
    assert "across recipes" in tune and "[" not in tune  # no interval across recipes


@pytest.mark.parametrize(
    ("value", "verdict"), [(-1.99, "met"), (-2.0, "met"), (-2.03, "missed by 0.03"), (-3.0, "missed by 1.0")]
)
def test_a_miss_is_never_shown_as_zero(report: ModuleType, value: float, verdict: str) -> None:
    assert report.verdict_of(value, -2) == verdict


def test_one_seed_is_shown_without_a_spread(report) -> None:
    """A cell with one finished seed has no sd: its value and the count, not "± 0.0"."""
    assert report._mean_sd([80.8]) == "80.8 (1)"
    assert report._mean_sd([80.0, 82.0]) == "81.0 ± 1.4 (2)"
    assert report._mean_sd([]) == "–"


def test_a_set_time_missing_unclocked_processes_is_shown_as_a_lower_bound(report, tmp_path: Path) -> None:
    (tmp_path / "a.time.json").write_text('{"set_s": 100.0, "segments": 1}\n')
    (tmp_path / "b.time.json").write_text('{"set_s": 300.0, "segments": 2, "unrecorded_segments": 1}\n')
    rows = [{"cell": "a", "set_s": 100.0}, {"cell": "b", "set_s": 50.0}, {"cell": "c", "set_s": None}]
    assert report._set_seconds(rows[:1], tmp_path) == "100 (1)"
    assert report._set_seconds(rows, tmp_path) == "≥ 200 (2)"  # b's time file holds more than its row
    assert report._set_seconds(rows[2:], tmp_path) == "–"
    assert report._set_seconds([{"cell": "d", "set_s": 70.0}], tmp_path) == "70 (1)"  # no time file: the row's


def test_pe_is_read_against_its_noise_only_control_at_eps_1_for_every_eps(report) -> None:
    rows = [
        {"method": "pe", "epsilon": eps, "n_per_class": 100, "seed": 0, "accuracy": acc, "head_accuracy": head}
        for eps, acc, head in ((1.0, 0.80, 0.70), (4.0, 0.78, 0.72))
    ]
    assert report.votes(report.grouped(rows)) == ["- no PE row has its noise-only control's row at the same n yet"]
    rows.append(
        {"method": "pe@noise", "epsilon": 1.0, "n_per_class": 100, "seed": 0, "accuracy": 0.75, "head_accuracy": 0.70}
    )
    assert report.votes(report.grouped(rows)) == [
        "- pe, ε = 1, n = 100 − pe@noise: head-only +0.0, fine-tune +5.0 points",
        "- pe, ε = 4, n = 100 − pe@noise: head-only +2.0, fine-tune +3.0 points",
    ]
    # with two seeds a side, each margin carries its Welch interval over seeds
    rows += [{**row, "seed": 1, "accuracy": row["accuracy"] + 0.02} for row in rows if row["epsilon"] == 1.0]
    line = report.votes(report.grouped(rows))[0]
    assert line.startswith("- pe, ε = 1, n = 100 − pe@noise: head-only +0.0, fine-tune +5.0 [")
    assert _interval(line.split("fine-tune")[1]) == pytest.approx(
        tuple(round(x, 1) for x in _welch([80.0, 82.0], [75.0, 77.0])), abs=0.051
    )
    assert "head-only +0.0," in line  # no spread between seeds on either side: no interval
