"""Reading: how much of PE's noisy histograms is votes and how much is noise (post-processing: no new ε).

Each PE iteration releases, per class, the vote counts c of its M candidates plus independent N(0, σ²) noise
per count. The noise is independent of the counts, so across one class's candidates

    var(noisy) = var(c) + σ²,    corr(noisy, c) = sd(c) / sd(noisy),

and ``var(noisy) − σ²`` estimates how unevenly the private votes fall on the candidates: the spread of this
histogram's true counts, unbiased over the noise, with standard error ``√((4σ²·spread + 2σ⁴)/(M − 1))`` over the
noise with the counts held fixed (Monte Carlo checked in ``tests/test_synthetic_at_scale_pe_votes.py``, on
counts with a few candidates holding most votes). Votes spread at random over the candidates would give
var(c) ≈ mean(c), about 2 at n = 1,000; a larger excess means the votes bunch. The noise is symmetric, so the
noisy counts' third central moment is the true counts' too (in expectation), and their skewness
(third moment / spread^1.5) says whether the bunching is a few candidates with many votes (large and
positive). The correlation is Pearson's, so the largest counts dominate it: it says how well the noisy counts
pick out the candidates with many votes (what PE's top ⌈M/(1+V)⌉ keep), not how well they order the rest.
Everything here is computed from the released histograms and the published σ, so it is post-processing of the
DP release.

    python research/synthetic_at_scale/pe_votes.py   # reads work/ and kept-runs/, adds to pe_votes.json, writes pe_votes.md

The histograms live in the cells' run folders under the git-ignored ``work/`` (never committed, so a new
machine lacks them) and, for a run not finished yet, in its public mirror under ``kept-runs/``
(:mod:`privlm.experiments.kept_runs`); ``pe_votes.json`` keeps every reading made (per cell, the one of the most
histograms), so the table outlives them. Run it right after ``privlm experiment … --keep-accounting``, so that
every histogram it reads is booked in the committed ``accounting.json``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from privlm.atomic import write_text_atomic
from privlm.synthesis.pe.mechanism import PEPaths

HERE = Path(__file__).resolve().parent
OUT = HERE / "pe_votes.json"


def readings(out: Path) -> list[dict[str, float | int | None]]:
    """One row per (iteration, class) of the PE run writing ``out``: the noisy histogram's mean and variance,
    the excess over σ² with its standard error, and the implied correlation with the true counts."""
    paths = PEPaths(Path(out))
    sigma = json.loads(paths.manifest.read_text())["noise_multiplier"]
    rows, t = [], 0
    while paths.histogram(t).exists():
        for label, counts in enumerate(json.loads(paths.histogram(t).read_text())["histograms"]):
            noisy = np.asarray(counts, dtype=np.float64)
            variance = float(noisy.var(ddof=1))
            excess = variance - sigma**2
            third = float(np.mean((noisy - noisy.mean()) ** 3))
            rows.append(
                {
                    "iteration": t,
                    "label": label,
                    "candidates": len(noisy),
                    "sigma": sigma,
                    "mean": float(noisy.mean()),
                    "variance": variance,
                    "excess": excess,
                    "excess_se": math.sqrt((4 * sigma**2 * max(excess, 0.0) + 2 * sigma**4) / (len(noisy) - 1)),
                    "correlation": math.sqrt(max(excess, 0.0) / variance),
                    "skewness": third / excess**1.5 if excess > 0 else None,
                }
            )
        t += 1
    return rows


def _span(rows: list[dict[str, float | int | None]], key: str, spec: str) -> str:
    """``key``'s range over ``rows``, the histograms with no reading left out and counted (skewness: none where
    the variance is not above σ²); "–" when none has one."""
    values = [r[key] for r in rows if r[key] is not None]
    if not values:
        return "–"
    left_out = f" ({len(values)} of {len(rows)})" if len(values) < len(rows) else ""
    return f"{min(values):{spec}} to {max(values):{spec}}{left_out}"


def main() -> None:
    kept = json.loads(OUT.read_text()) if OUT.exists() else {}
    for folder in [
        *sorted((HERE / "work").glob(f"pe_*/synthetic.jsonl{PEPaths.SUFFIX}")),
        *sorted((HERE / "kept-runs").glob(f"pe_*/synthetic.jsonl{PEPaths.SUFFIX}")),  # public mirrors
    ]:
        found = readings(folder.parent / "synthetic.jsonl")
        if found and len(found) >= len(kept.get(folder.parent.name, [])):  # a run with no histogram yet: none
            kept[folder.parent.name] = found
    write_text_atomic(OUT, json.dumps(kept, indent=1) + "\n")
    lines = [
        "# PE's noisy histograms: votes against noise (`pe_votes.py`, post-processing of the releases)",
        "",
        "Per PE run, over its histograms drawn so far (every iteration and class; each histogram's row is in",
        "`pe_votes.json`): the candidates M per class, σ, the noisy counts' mean, the variance above σ² (the true",
        "counts' spread; a random spread of the votes would give about the mean), the true counts' skewness (read",
        "from the noisy third moment) and the implied Pearson correlation between noisy and true counts, as the",
        "range over histograms.",
        "",
        "| cell | M | σ | histograms | mean count | excess over σ² | skewness | corr(noisy, true) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for cell, rows in kept.items():
        mean = sum(r["mean"] for r in rows) / len(rows)
        lines.append(
            f"| {cell} | {rows[0]['candidates']} | {rows[0]['sigma']:.2f} | {len(rows)} | {mean:.1f} "
            f"| {_span(rows, 'excess', '.0f')} (se ≤ {max(r['excess_se'] for r in rows):.0f}) "
            f"| {_span(rows, 'skewness', '.1f')} | {_span(rows, 'correlation', '.2f')} |"
        )
    write_text_atomic(HERE / "pe_votes.md", "\n".join(lines) + "\n")
    print(f"{sum(map(len, kept.values()))} histograms of {len(kept)} run(s) in {OUT.name} and pe_votes.md")


if __name__ == "__main__":
    main()
