"""``research/synthetic_at_scale/pe_votes.py``: its reading of a noisy PE histogram against Monte Carlo. With the
true counts held fixed (about 2 votes a candidate; no hubs, or a few candidates with 40–170 votes each: a spread
like PE's at n = 1,000, and six times that) and fresh Gaussian noise per draw, the excess over σ² is unbiased
for the counts' spread, its stated standard error is the spread of the excess over the draws, the stated
correlation is the draws' own correlation between noisy and true counts, and the stated skewness is the true
counts'."""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "research" / "synthetic_at_scale" / "pe_votes.py"
SIGMA, M, DRAWS = 11.8, 2000, 1000


@pytest.fixture(scope="module")
def pe_votes(research_script) -> ModuleType:
    return research_script("synthetic_at_scale/pe_votes.py")


def _counts(rng: np.random.Generator, hubs: int) -> np.ndarray:
    """About 2 votes a candidate, ``hubs`` candidates with 40–170 each."""
    counts = rng.poisson(1.5, size=M).astype(np.float64)
    counts[rng.choice(M, size=hubs, replace=False)] = rng.integers(40, 170, size=hubs)
    return counts


@pytest.mark.parametrize("hubs", [0, 5, 60])  # spreads 1.5, 53 and 355
def test_the_excess_its_error_and_the_correlation_agree_with_monte_carlo(pe_votes, tmp_path, hubs) -> None:
    rng = np.random.default_rng(hubs)
    counts = _counts(rng, hubs)
    spread = counts.var(ddof=1)
    out = tmp_path / "synthetic.jsonl"
    paths = pe_votes.PEPaths(out)
    paths.workdir.mkdir()
    paths.manifest.write_text(json.dumps({"noise_multiplier": SIGMA}))
    draws = [counts + rng.normal(0.0, SIGMA, size=M) for _ in range(DRAWS)]
    for t, noisy in enumerate(draws):
        paths.histogram(t).write_text(json.dumps({"histograms": [noisy.tolist()]}))
    readings = pe_votes.readings(out)
    assert len(readings) == DRAWS
    excess = np.array([r["excess"] for r in readings])
    stated_se = np.mean([r["excess_se"] for r in readings])
    assert abs(excess.mean() - spread) < 4 * excess.std() / np.sqrt(DRAWS)  # unbiased
    assert excess.std() == pytest.approx(stated_se, rel=0.08)
    actual = np.mean([np.corrcoef(noisy, counts)[0, 1] for noisy in draws])
    assert np.mean([r["correlation"] for r in readings]) == pytest.approx(actual, abs=0.02)
    if hubs:  # the true counts' skewness, read through the noise
        skewness = np.mean((counts - counts.mean()) ** 3) / spread**1.5
        assert np.mean([r["skewness"] for r in readings]) == pytest.approx(skewness, rel=0.1)


def _run(out: Path, pe_votes: ModuleType, histograms: int, candidates: int = 5) -> None:
    paths = pe_votes.PEPaths(out)
    paths.workdir.mkdir(parents=True)
    paths.manifest.write_text(json.dumps({"noise_multiplier": SIGMA}))
    for t in range(histograms):
        paths.histogram(t).write_text(json.dumps({"histograms": [[float(t + k) for k in range(candidates)]] * 2}))


def test_the_table_keeps_each_cells_longest_reading_and_skips_runs_with_none(pe_votes, tmp_path, monkeypatch) -> None:
    """A run that has drawn no histogram yet is left out (it used to crash the table), a live run's reading
    replaces the kept one only when it covers at least as many histograms (a run started over keeps the lost
    run's longer reading), a mirror under ``kept-runs/`` is read like a live run, and histograms whose variance is
    not above σ² (no skewness reading) still give a row."""
    monkeypatch.setattr(pe_votes, "HERE", tmp_path)
    monkeypatch.setattr(pe_votes, "OUT", tmp_path / "pe_votes.json")
    _run(tmp_path / "lost" / "synthetic.jsonl", pe_votes, histograms=3)
    kept = {"pe_restarted": pe_votes.readings(tmp_path / "lost" / "synthetic.jsonl")}  # the lost run's 3
    (tmp_path / "pe_votes.json").write_text(json.dumps(kept))
    _run(tmp_path / "work" / "pe_fresh" / "synthetic.jsonl", pe_votes, histograms=0)
    _run(tmp_path / "work" / "pe_restarted" / "synthetic.jsonl", pe_votes, histograms=2)
    _run(tmp_path / "kept-runs" / "pe_mirrored" / "synthetic.jsonl", pe_votes, histograms=2)
    pe_votes.main()
    table = json.loads((tmp_path / "pe_votes.json").read_text())
    assert sorted(table) == ["pe_mirrored", "pe_restarted"]
    assert table["pe_restarted"] == kept["pe_restarted"]
    assert [(r["iteration"], r["label"]) for r in table["pe_mirrored"]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    markdown = (tmp_path / "pe_votes.md").read_text()
    assert "pe_fresh" not in markdown
    row = next(line for line in markdown.splitlines() if line.startswith("| pe_mirrored | 5 |"))
    assert row.split(" | ")[-2] == "–"  # the counts' spread is below σ²: no skewness to read, the row still written
