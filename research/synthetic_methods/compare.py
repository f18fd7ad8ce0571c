"""The methods table: PE and DP fine-tune-then-generate (this folder) beside GRADMM, its noise-only control,
zero-shot generation and real-data references (research/synthetic_full_split, same model, data, splits and
fine-tuning): test accuracy mean ± sd over the finished seeds, and the mean wall time of making the set.
Last row: DP fine-tuning directly on all 8,453 private sentences (research/dp_finetune_rotten_tomatoes, that study's
head-only recipe, `hutchinson` k = 32), re-scored from its saved predictions on the same 300 test sentences
the grid uses (the seeded subset of the same test split), the reference a synthetic set tries to approach.

    python research/synthetic_methods/compare.py > research/synthetic_methods/table.md
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
DPFT = HERE.parent / "dp_finetune_rotten_tomatoes"
TEST_SIZE, DATA_SEED = 300, 0  # research/synthetic_methods/config.toml
FOLDERS = (HERE, HERE.parent / "synthetic_full_split")
METHODS = (
    "pe",
    "dp-finetune-gen",
    "gradmm",
    "gradmm@contrast",
    "gradmm@instruct",
    "gradmm@instruct-own",
    "gradmm@noise",
    "gradmm@instruct-noise",
    "zero-shot",
    "random",
    "herding",
)


def rows() -> list[dict]:
    """Every finished cell of both folders."""
    found = []
    for folder in FOLDERS:
        path = folder / "results.jsonl"
        if path.exists():
            found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def direct_rows() -> dict[object, list[tuple[float, float]]]:
    """Per ε (None: non-private): (accuracy on the grid's 300 test sentences, training seconds) of each
    seed of DP fine-tuning directly (``rt-eps{ε}-hutchinson32-s{seed}`` / ``rt-nondp-s{seed}``)."""
    from privlm.experiments.sampling import subsample
    from privlm.resources.datasets import load_dataset

    test = load_dataset("rotten-tomatoes", split="test", seed=DATA_SEED).examples
    positions = {id(e): i for i, e in enumerate(test)}
    keep = {positions[id(e)] for e in subsample(test, TEST_SIZE, DATA_SEED)}
    found: dict[object, list[tuple[float, float]]] = defaultdict(list)
    for cell in sorted((DPFT / "cells").glob("rt-*.json")):
        summary = json.loads(cell.read_text())
        if summary.get("norm_mode") not in ("hutchinson", None):
            continue
        preds = [json.loads(line) for line in (DPFT / "predictions" / f"{cell.stem}.jsonl").read_text().splitlines()]
        hits = [p["gold"] == p["predicted"] for p in preds if p["index"] in keep]
        if len(hits) != TEST_SIZE:
            raise SystemExit(f"{cell.name}: {len(hits)} of the {TEST_SIZE} test sentences in its predictions")
        eps = round(summary["epsilon"]) if summary.get("private") else None
        found[eps].append((100 * sum(hits) / len(hits), summary["train_wall_s"]))
    return found


def table() -> str:
    """Markdown: one line per (method, ε), one column per n: accuracy mean ± sd (seeds), set-making seconds."""
    cells: dict[tuple[str, object], dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows():
        if row["method"] in METHODS and row["n_per_class"] in (20, 100):
            cells[(row["method"], row["epsilon"])][row["n_per_class"]].append(row)
    lines = [
        "| method | ε | n = 20: accuracy % (seeds) | set s | n = 100: accuracy % (seeds) | set s |",
        "|---|---|---|---|---|---|",
    ]
    for method in METHODS:
        for eps in (1.0, 4.0, None):
            if (method, eps) not in cells:
                continue
            parts = []
            for n in (20, 100):
                found = cells[(method, eps)].get(n, [])
                if not found:
                    parts += ["–", "–"]
                    continue
                acc = [100 * r["accuracy"] for r in found]
                sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
                parts += [
                    f"{statistics.mean(acc):.1f} ± {sd:.1f} ({len(acc)})",
                    f"{statistics.mean(r['set_s'] for r in found):.0f}",
                ]
            lines.append(f"| {method} | {'none' if eps is None else f'{eps:g}'} | " + " | ".join(parts) + " |")
    for eps, found in sorted(direct_rows().items(), key=lambda kv: (kv[0] is None, kv[0] or 0)):
        acc = [a for a, _ in found]
        sd = statistics.stdev(acc) if len(acc) > 1 else 0.0
        cell = f"{statistics.mean(acc):.1f} ± {sd:.1f} ({len(acc)})"
        train_s = f"{statistics.mean(t for _, t in found):.0f}"
        lines.append(
            f"| DP fine-tuning directly (all 8,453, head-only) | {'none' if eps is None else eps} | "
            f"{cell} | {train_s} | {cell} | {train_s} |"
        )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
