"""Issue 15's table: PE and DP fine-tune-then-generate (this folder) beside GRADMM, its noise-only control,
zero-shot generation and real-data references (results/rotten_tomatoes_full, same model, data, splits and
fine-tuning): test accuracy mean ± sd over the finished seeds, and the mean wall time of making the set.

    python results/rotten_tomatoes_pe/compare.py > results/rotten_tomatoes_pe/table.md
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

HERE = Path(__file__).resolve().parent
FOLDERS = (HERE, HERE.parent / "rotten_tomatoes_full")
METHODS = ("pe", "dp-finetune-gen", "gradmm", "gradmm@contrast", "gradmm@instruct", "gradmm@instruct-own", "gradmm@noise",
           "gradmm@instruct-noise", "zero-shot", "random", "herding")


def rows() -> list[dict]:
    """Every finished cell of both folders."""
    found = []
    for folder in FOLDERS:
        path = folder / "results.jsonl"
        if path.exists():
            found += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return found


def table() -> str:
    """Markdown: one line per (method, ε), one column per n: accuracy mean ± sd (seeds), set-making seconds."""
    cells: dict[tuple[str, object], dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows():
        if row["method"] in METHODS and row["n_per_class"] in (20, 100):
            cells[(row["method"], row["epsilon"])][row["n_per_class"]].append(row)
    lines = ["| method | ε | n = 20: accuracy % (seeds) | set s | n = 100: accuracy % (seeds) | set s |",
             "|---|---|---|---|---|---|"]
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
                parts += [f"{statistics.mean(acc):.1f} ± {sd:.1f} ({len(acc)})",
                          f"{statistics.mean(r['set_s'] for r in found):.0f}"]
            lines.append(f"| {method} | {'none' if eps is None else f'{eps:g}'} | " + " | ".join(parts) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(table(), end="")
