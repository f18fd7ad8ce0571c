"""Every cell of research/dp_finetune_bbc and research/dp_finetune_rotten_tomatoes, in order, skipping finished ones.

    OMP_NUM_THREADS=1 nohup .venv/bin/python research/dp_finetune_bbc/run.py > runs/bbc_news_v2/driver.log 2>&1 &

Each cell is one ``privlm train ... --resume --json`` command (printed in the log and stored in the cell's
JSON), run in its own folder ``runs/bbc_news_v2/<cell>/`` (git-ignored; checkpoints, private). Killing the
driver and starting it again continues the unfinished cell from its last checkpoint and skips finished
ones. The frozen model's features are computed once per (data set, T) into a private cache folder
``runs/bbc_news_v2/cache-<data>-T<T>/`` shared by that data set's cells (bound to the data and model by
fingerprints; never under research/). Results: ``<results>/cells/<cell>.json`` (the ``--json`` summary plus
command, wall time and the process's peak resident memory) and ``<results>/predictions/<cell>.jsonl``.

Stages: (1) the recipe (lr, epochs, B) chosen once on ``tweets`` (not a reported data set): a grid at
ε = 3, the best test accuracy wins (first in grid order on ties) → ``research/dp_finetune_bbc/recipe.json``;
(2) BBC News T = 256: ε = 3 ``mixed`` / ``hutchinson`` k = 32 / non-private, seeds 0-2, then ε = 0.7
``hutchinson`` vs ``hutchpp`` (32 probes), seeds 0-2; (3) Rotten Tomatoes, whole train split, ε = 3
``mixed`` / ``hutchinson`` / non-private, seeds 0-2; (4) BBC News T = 1024 (long context), ε = 3
``hutchinson`` and ``mixed``, seed 0; (5) Rotten Tomatoes at ε = 1 and ε = 4, ``hutchinson`` k = 32, seeds 0-2
(the "DP fine-tuning directly" reference of the synthetic-text methods table, research/synthetic_methods).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import cell_runner  # noqa: E402  (research/cell_runner.py: research/ is not a package)

ROOT = cell_runner.ROOT
RUNS = ROOT / "runs" / "bbc_news_v2"
BBC = ROOT / "research" / "dp_finetune_bbc"
RT = ROOT / "research" / "dp_finetune_rotten_tomatoes"
GRID = [(lr, epochs, batch) for batch in (128, 512) for epochs in (10, 40) for lr in (3e-3, 1e-2, 3e-2)]
SEEDS = (0, 1, 2)


def run_cell(results: Path, name: str, data: str, max_length: int, args: list[str]) -> dict | None:
    """Run one cell unless its JSON exists (``research/cell_runner.py``); returns its summary."""
    options = [
        "--data",
        data,
        "--task",
        "classify",
        "--max-length",
        str(max_length),
        "--cache-dir",
        str(RUNS / f"cache-{data}-T{max_length}"),
        "--checkpoint-every",
        "50",
        *args,
    ]
    return cell_runner.run_cell(results, name, RUNS / name, options)


def recipe() -> dict:
    """Stage 1: the grid on tweets; the best cell's (lr, epochs, B)."""
    path = BBC / "recipe.json"
    if path.exists():
        return json.loads(path.read_text())
    results = BBC / "recipe_selection"
    scored = []
    for lr, epochs, batch in GRID:
        name = f"tweets-lr{lr:g}-ep{epochs}-b{batch}"
        summary = run_cell(
            results,
            name,
            "tweets",
            256,
            [
                "--epsilon",
                "3",
                "--norm-mode",
                "mixed",
                "--seed",
                "0",
                "--lr",
                str(lr),
                "--epochs",
                str(epochs),
                "--batch-size",
                str(batch),
            ],
        )
        if summary is None:
            sys.exit(f"recipe cell {name} failed")
        scored.append((summary["test"]["accuracy"], -GRID.index((lr, epochs, batch)), lr, epochs, batch))
    accuracy, _, lr, epochs, batch = max(scored)
    chosen = {
        "lr": lr,
        "epochs": epochs,
        "batch_size": batch,
        "tweets_test_accuracy": accuracy,
        "chosen_on": "tweets (seeded 80/10/10 split, test split), eps=3, mixed, seed 0; not a reported data set",
    }
    path.write_text(json.dumps(chosen, indent=2) + "\n")
    return chosen


def main() -> None:
    RUNS.mkdir(parents=True, exist_ok=True)
    best = recipe()
    hyper = ["--lr", str(best["lr"]), "--epochs", str(best["epochs"]), "--batch-size", str(best["batch_size"])]
    private3 = ["--epsilon", "3", "--delta", "1e-5"]
    cells = []
    for seed in SEEDS:
        cells += [
            (BBC, f"bbc-T256-eps3-mixed-s{seed}", "bbc-news", 256, [*private3, "--norm-mode", "mixed"], seed),
            (
                BBC,
                f"bbc-T256-eps3-hutchinson32-s{seed}",
                "bbc-news",
                256,
                [*private3, "--norm-mode", "hutchinson", "--probes", "32"],
                seed,
            ),
            (BBC, f"bbc-T256-nondp-s{seed}", "bbc-news", 256, ["--no-dp"], seed),
        ]
    for seed in SEEDS:
        for mode in ("hutchinson", "hutchpp"):
            cells.append(
                (
                    BBC,
                    f"bbc-T256-eps0.7-{mode}32-s{seed}",
                    "bbc-news",
                    256,
                    ["--epsilon", "0.7", "--delta", "1e-5", "--norm-mode", mode, "--probes", "32"],
                    seed,
                )
            )
    for seed in SEEDS:
        cells += [
            (RT, f"rt-eps3-mixed-s{seed}", "rotten-tomatoes", 256, [*private3, "--norm-mode", "mixed"], seed),
            (
                RT,
                f"rt-eps3-hutchinson32-s{seed}",
                "rotten-tomatoes",
                256,
                [*private3, "--norm-mode", "hutchinson", "--probes", "32"],
                seed,
            ),
            (RT, f"rt-nondp-s{seed}", "rotten-tomatoes", 256, ["--no-dp"], seed),
        ]
    cells += [
        (
            BBC,
            "bbc-T1024-eps3-hutchinson32-s0",
            "bbc-news",
            1024,
            [*private3, "--norm-mode", "hutchinson", "--probes", "32"],
            0,
        ),
        (BBC, "bbc-T1024-eps3-mixed-s0", "bbc-news", 1024, [*private3, "--norm-mode", "mixed"], 0),
        (BBC, "bbc-T1024-nondp-s0", "bbc-news", 1024, ["--no-dp"], 0),
    ]
    for eps in ("1", "4"):
        cells += [
            (
                RT,
                f"rt-eps{eps}-hutchinson32-s{seed}",
                "rotten-tomatoes",
                256,
                ["--epsilon", eps, "--delta", "1e-5", "--norm-mode", "hutchinson", "--probes", "32"],
                seed,
            )
            for seed in SEEDS
        ]
    for results, name, data, max_length, args, seed in cells:
        run_cell(results, name, data, max_length, [*args, *hyper, "--seed", str(seed)])
    print(f"[{time.strftime('%H:%M:%S')}] all cells done", flush=True)


if __name__ == "__main__":
    main()
