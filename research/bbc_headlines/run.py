"""The private cells of the bbc-headlines study, in priority order, skipping finished ones.

    nohup .venv/bin/python research/bbc_headlines/run.py > runs/bbc_headlines/driver.log 2>&1 &

Each cell is one ``privlm train --task generate ... --resume --json`` command (printed in the log and kept in
the cell's JSON), run in its own folder ``runs/bbc_headlines/<cell>/`` (git-ignored: checkpoints and the
adapter). Killing the driver and starting it again continues the unfinished cell from its last checkpoint and
skips finished ones. The hidden states entering the trained blocks are computed once per T into the private
cache ``runs/bbc_headlines/cache-T<T>/`` shared by the cells (bound to the data and model by fingerprints;
never under research/). Results: ``cells/<cell>.json`` (the ``--json`` summary plus command, wall time and
peak resident memory) and ``predictions/<cell>.jsonl`` (test index, reference headline, generated one).

The recipe is fixed before any private cell runs and never tuned on test (``RECIPE``): the prompt is the one
``references.py`` chose on the validation split (the chat template), T = 1,024, the top 2 decoder blocks as
LoRA r = 8 adapters over the cached prefix, B = 64 expected (Poisson), 2 epochs, AdamW lr 2e-3, C = 1,
≤ 24 new tokens. No recipe grid was run: one cell costs about an hour on this 2-core machine. Private steps
run in micro-batches of 8 rows sorted by length, each cut to its longest row (memory and speed only: the
clipped sum is the same up to rounding; about 0.56× the padded tokens of one batch of 64 on these lengths).

Order: the non-private cell with the recipe; ε = 3 ``mixed`` (exact) and ``hutchinson`` k = 32, seed 0;
ε = 30 ``mixed``, seed 0 (added after ε = 3 ``mixed`` missed non-private by 4.5 points: the same run with
σ 0.35 instead of 0.87, to tell the noise's share of that gap from clipping's); the same pair, seed 1; then
(added after ε = 30 scored as ε = 3, both runs being noise-dominated) clipping without noise
(``--noise-multiplier 0``, NOT private: an ablation, not a release; first queued at σ = 0.05, which the noise
sampler refuses below σ = 0.2) and ε = 3 with LoRA r = 1 (8× fewer trained numbers: √8 less noise norm); the pair at seed 2; ε = 0.7 ``hutchinson`` vs ``hutchpp`` (32 probes), seed 0; then the same top-2-block
LoRA recipe on BBC News *classification* (``--data bbc-news --no-head-only``, the label-word objective, the
articles of the same split), ε = 3 ``mixed`` vs ``hutchinson``, seed 0 (``cls-`` cells, their own cache),
then seeds 1 and 2 of that pair (added after seed 0 missed "within 0.7" by 0.2 points on one seed); last, ``hutchinson`` at ε = 3, seed 0, at T = 2,048 (its own cache: the 78 of 1,779 training prompts, 4.4 %,
cut to fit T = 1,024 keep more of their body).
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
import cell_runner  # noqa: E402  (research/cell_runner.py: research/ is not a package)

ROOT = cell_runner.ROOT
RUNS = ROOT / "runs" / "bbc_headlines"
RECIPE = {
    "max_length": 1024,
    "train_layers": 2,
    "lora": 8,
    "batch_size": 64,
    "physical_batch_size": 8,
    "epochs": 2,
    "lr": 2e-3,
    "clip": 1.0,
    "max_new_tokens": 24,
    "delta": 1e-5,
}
THREADS = os.environ.get("OMP_NUM_THREADS", "2")


def recipe_args(recipe: dict, task: str) -> list[str]:
    """The ``privlm train`` options of the fixed recipe for ``task`` (generate: the prompt template from
    references.json; classify: BBC News's own label-word prompt)."""
    if task == "generate":
        template = json.loads((HERE / "references.json").read_text())["template"]
        data = ["--data", "bbc-headlines", "--task", "generate", "--template", template.replace("\n", "\\n")]
        data += ["--max-new-tokens", str(recipe["max_new_tokens"])]
    else:
        data = ["--data", "bbc-news", "--task", "classify", "--no-head-only"]
    return [
        *data,
        "--max-length",
        str(recipe["max_length"]),
        "--train-layers",
        str(recipe["train_layers"]),
        "--lora",
        str(recipe["lora"]),
        "--batch-size",
        str(recipe["batch_size"]),
        "--physical-batch-size",
        str(recipe["physical_batch_size"]),
        "--epochs",
        str(recipe["epochs"]),
        "--lr",
        str(recipe["lr"]),
        "--clip",
        str(recipe["clip"]),
        "--cache-dir",
        str(RUNS / (f"cache-T{recipe['max_length']}" if task == "generate" else f"cache-cls-T{recipe['max_length']}")),
    ]


def cells() -> list[tuple[str, list[str]]]:
    """(name, the cell's own options) in the order they run; a ``-T<n>`` name runs the recipe at T = n, an
    ``-r<n>`` name with LoRA rank n."""
    private3 = ["--epsilon", "3", "--delta", str(RECIPE["delta"])]
    out = [("nondp-s0", ["--no-dp", "--seed", "0"])]
    for seed in (0, 1, 2):
        out += [
            (f"eps3-mixed-s{seed}", [*private3, "--norm-mode", "mixed", "--seed", str(seed)]),
            (
                f"eps3-hutchinson32-s{seed}",
                [*private3, "--norm-mode", "hutchinson", "--probes", "32", "--seed", str(seed)],
            ),
        ]
        if seed == 0:  # the ablation of ε = 3's miss against non-private: the same run with 2.5x less noise
            out.append(
                (
                    "eps30-mixed-s0",
                    ["--epsilon", "30", "--delta", str(RECIPE["delta"]), "--norm-mode", "mixed", "--seed", "0"],
                )
            )
        if (
            seed == 1
        ):  # ε = 30 did not help (both noise-dominated): clipping without noise, and 8x fewer trained numbers
            out += [
                ("clip-mixed-s0", ["--noise-multiplier", "0", "--norm-mode", "mixed", "--seed", "0"]),
                ("eps3-mixed-r1-s0", [*private3, "--norm-mode", "mixed", "--seed", "0"]),
            ]
    for mode in ("hutchinson", "hutchpp"):
        out.append(
            (
                f"eps0.7-{mode}32-s0",
                [
                    "--epsilon",
                    "0.7",
                    "--delta",
                    str(RECIPE["delta"]),
                    "--norm-mode",
                    mode,
                    "--probes",
                    "32",
                    "--seed",
                    "0",
                ],
            )
        )
    for seed in (0, 1, 2):
        out += [
            (f"cls-eps3-mixed-s{seed}", [*private3, "--norm-mode", "mixed", "--seed", str(seed)]),
            (
                f"cls-eps3-hutchinson32-s{seed}",
                [*private3, "--norm-mode", "hutchinson", "--probes", "32", "--seed", str(seed)],
            ),
        ]
    out.append(
        ("eps3-hutchinson32-T2048-s0", [*private3, "--norm-mode", "hutchinson", "--probes", "32", "--seed", "0"])
    )
    return out


def run_cell(name: str, own: list[str]) -> dict | None:
    """Run one cell unless its JSON exists (``research/cell_runner.py``); returns its summary."""
    recipe = dict(RECIPE)
    for key, pattern in (("max_length", r"-T(\d+)-"), ("lora", r"-r(\d+)-")):
        found = re.search(pattern, name)
        if found:
            recipe[key] = int(found.group(1))
    args = [
        *recipe_args(recipe, "classify" if name.startswith("cls-") else "generate"),
        *own,
        "--checkpoint-every",
        "5",
    ]
    return cell_runner.run_cell(HERE, name, RUNS / name, args, THREADS)


def main() -> None:
    RUNS.mkdir(parents=True, exist_ok=True)
    (HERE / "recipe.json").write_text(json.dumps(RECIPE, indent=2) + "\n")
    for name, own in cells():
        run_cell(name, own)


if __name__ == "__main__":
    main()
