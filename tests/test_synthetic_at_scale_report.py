"""The study report's reading of a target gap (``research/synthetic_at_scale/report.py: resolution``): its 95 %
interval is Welch's, checked against the Welch–Satterthwaite formula written out here, and the verdict follows
the interval's side of the threshold."""

from __future__ import annotations

import importlib.util
import math
import re
import statistics
from pathlib import Path
from types import ModuleType

import pytest
from scipy.stats import t as student_t

SCRIPT = Path(__file__).resolve().parents[1] / "research" / "synthetic_at_scale" / "report.py"


@pytest.fixture(scope="module")
def report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("synthetic_at_scale_report", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
