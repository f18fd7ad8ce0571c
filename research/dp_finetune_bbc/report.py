"""Tables of research/dp_finetune_bbc and research/dp_finetune_rotten_tomatoes from the finished cells.

    .venv/bin/python research/dp_finetune_bbc/report.py

Reads ``<folder>/cells/<cell>.json`` and ``<folder>/predictions/<cell>.jsonl`` (written by ``run.py``) and
writes ``<folder>/report.md``: per setting (cell name without its seed) the test accuracy of each seed,
their mean, σ and ε; every randomized-vs-exact pair at the same seed (same Poisson batches, same noise
direction: a common-random-numbers comparison) with its paired difference, a paired bootstrap 95%
interval over test examples of the mean difference across seeds, and the confusion matrix of each setting
(summed over seeds; rows gold, columns predicted).
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
FOLDERS = (HERE, HERE.parent / "dp_finetune_rotten_tomatoes")
PAIRS = (("eps3-hutchinson32", "eps3-mixed"), ("eps0.7-hutchpp32", "eps0.7-hutchinson32"))


def load(folder: Path) -> dict[str, dict[int, tuple[dict, list[dict]]]]:
    """setting → seed → (summary, predictions)."""
    out: dict[str, dict[int, tuple[dict, list[dict]]]] = defaultdict(dict)
    for path in sorted((folder / "cells").glob("*.json")):
        match = re.fullmatch(r"(.+?)(?:-s(\d+))?", path.stem)  # zero-shot cells have no seed
        predictions = [
            json.loads(line) for line in (folder / "predictions" / f"{path.stem}.jsonl").read_text().splitlines()
        ]
        out[match.group(1)][int(match.group(2) or 0)] = (json.loads(path.read_text()), predictions)
    return out


def correct(predictions: list[dict]) -> np.ndarray:
    return np.array([p["gold"] == p["predicted"] for p in predictions], dtype=float)


def paired_interval(a: list[np.ndarray], b: list[np.ndarray], seed: int = 0) -> tuple[float, float, float]:
    """Mean over seeds of accuracy(a) − accuracy(b), and a 95% bootstrap interval resampling test examples."""
    diff = np.mean([x - y for x, y in zip(a, b)], axis=0)
    rng = np.random.default_rng(seed)
    means = [diff[rng.integers(0, len(diff), len(diff))].mean() for _ in range(2000)]
    return float(diff.mean()), float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def report(folder: Path) -> str:
    cells = load(folder)
    lines = [
        f"# {folder.name}: finished cells",
        "",
        "| setting | seeds | test accuracy per seed | mean | σ (accounted) | ε | train s (cell s) | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for setting, seeds in sorted(cells.items()):
        summaries = [seeds[s][0] for s in sorted(seeds)]
        accuracies = [s["test"]["accuracy"] for s in summaries]
        first = summaries[0]
        if "steps" not in first:  # zero-shot: no training
            lines.append(f"| {setting} | – | {accuracies[0]:.1%} | {accuracies[0]:.1%} | – | 0 | – | – |")
            continue
        sigma = (
            "–"
            if first["noise_multiplier"] is None
            else f"{first['noise_multiplier']:.3f} ({first['accounted_noise_multiplier']:.3f})"
        )
        epsilon = "∞" if first["epsilon"] is None else f"{max(s['epsilon'] for s in summaries):.3f}"
        lines.append(
            f"| {setting} | {','.join(map(str, sorted(seeds)))} | {' / '.join(f'{a:.1%}' for a in accuracies)} | "
            f"{np.mean(accuracies):.1%} | {sigma} | {epsilon} | "
            f"{np.mean([s['train_wall_s'] for s in summaries]):.1f} ({np.mean([s['cell_wall_s'] for s in summaries]):.0f}) | "
            f"{max(s['peak_rss_mb'] for s in summaries):.0f} |"
        )
    lines += [
        "",
        "## Randomized vs exact, paired (same seed: same batches and noise direction)",
        "",
        "| pair | seeds | per-seed difference (points) | agree on | mean difference, 95% paired bootstrap |",
        "|---|---|---|---|---|",
    ]
    for prefix in sorted({re.sub(r"eps.*", "", s) for s in cells}):
        for a, b in PAIRS:
            left, right = cells.get(prefix + a, {}), cells.get(prefix + b, {})
            seeds = sorted(set(left) & set(right))
            if not seeds:
                continue
            xs = [correct(left[s][1]) for s in seeds]
            ys = [correct(right[s][1]) for s in seeds]
            agree = [sum(p["predicted"] == q["predicted"] for p, q in zip(left[s][1], right[s][1])) for s in seeds]
            mean, low, high = paired_interval(xs, ys)
            lines.append(
                f"| {prefix}{a} − {prefix}{b} | {','.join(map(str, seeds))} | "
                f"{' / '.join(f'{100 * (x.mean() - y.mean()):+.1f}' for x, y in zip(xs, ys))} | "
                f"{' / '.join(f'{n}/{len(xs[0])}' for n in agree)} | {100 * mean:+.2f} [{100 * low:+.2f}, {100 * high:+.2f}] |"
            )
    lines += ["", "## Confusion matrices (summed over seeds; rows gold, columns predicted)", ""]
    for setting, seeds in sorted(cells.items()):
        k = len(seeds[min(seeds)][1][0]["scores"])
        matrix = np.zeros((k, k), dtype=int)
        for _, predictions in seeds.values():
            for p in predictions:
                matrix[p["gold"], p["predicted"]] += 1
        lines.append(f"- {setting}: {matrix.tolist()}")
    return "\n".join(lines) + "\n"


def main() -> None:
    for folder in FOLDERS:
        if (folder / "cells").is_dir():
            (folder / "report.md").write_text(report(folder))
            print(f"wrote {folder / 'report.md'}")


if __name__ == "__main__":
    main()
