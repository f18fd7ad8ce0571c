"""Ablation: PE's n = 100 sets grown to 1,000 per class by public rewrites (post-processing: no new ε).

PE at n = 1,000 votes over 2,000 candidates per class, so each candidate gets about 2 of the about 4,200 private votes
of its class against Gaussian noise of σ = 11.8 on every count at ε = 1 (T = 10); at n = 100 the same σ faces
about 21 votes a candidate. This script asks whether 1,000 per class do better grown from the n = 100 run's
released set: each of its 100 texts per class (chosen by the better-powered histograms) is rewritten V = 9
times by the public model with PE's own variation prompt, giving 100 + 900 rows per class. The grown set is
post-processing of the committed DP set (public model, public prompt, public seed): it costs the n = 100 cell's
ε and draws nothing. Its control grows the zero-shot n = 100 set (texts like PE's starting population, no votes)
the same way, so a difference between the two is the votes', not the rewrites'.

Each set is read with the grid's head-only classifier (the same fit, seed and whole test split as the grid's
rows, on ``head_steps.py``'s features; the n = 100 set is refitted first and must reproduce its row's
``head_accuracy``: checked) and fitted to convergence (``head_steps.py``), since the grid's fit gives a grown set
ten times the steps. The continuity fine-tune is not run (about an hour a set).

    python research/synthetic_at_scale/pe_grow.py [--cells GLOB]   # writes pe_grow.json, pe_grow.md

About 15 min of rewrites per set on one free core. The grown sets are kept under ``work/pe-grow/`` (git-ignored)
and reused; a run adds the cells it has not read yet to ``pe_grow.json``.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import time

import torch
from head_steps import HERE, Study, accuracy, converged, load_study, validation_chosen
from report import _mean_sd

from privlm.atomic import write_text_atomic
from privlm.experiments.config import load_config
from privlm.experiments.records import read_training_set
from privlm.lm.generation import sample_many
from privlm.synthesis.pe.config import PEConfig
from privlm.synthesis.pe.mechanism import rewrite_prompt, rewrite_seed
from privlm.training.head_probe import fit_rows

GROWN = HERE / "work" / "pe-grow"
SOURCES = ("pe", "zero-shot")  # the DP sets and their no-vote control
SIZE, GROWTH = 100, 10  # the sets grown: n = 100 per class, to GROWTH times as many (each row and 9 rewrites)
READINGS = ("n100_head", "grown_head", "n100_converged", "grown_converged")  # the table's columns, in order
ORDER = ("pe_n100_seed0_eps1", "zero-shot_n100_seed0_*", "pe_n100_seed0_eps4", "*")  # what is read first


def pe_config(seed: int) -> PEConfig:
    """The grid's PE settings (``config.toml``) at ``seed``: its rewrite prompt and sampling."""
    spec = next(m for m in load_config(HERE / "config.toml").methods if m.name == "pe")
    return PEConfig(**{**spec.params, "seed": seed})


def grow(study: Study, row: dict) -> tuple[list[tuple[str, int]], float]:
    """The cell's committed set with GROWTH − 1 rewrites of each row after it, class by class, and the seconds
    the rewrites took (0 when read back from ``work/pe-grow/``). Each class's rewrites are seeded like one more
    PE iteration after the run's last (public)."""
    path = GROWN / f"{row['cell']}.jsonl"
    if path.exists():
        return read_training_set(path, study.label_names), 0.0
    examples = read_training_set(HERE / "sets" / f"{row['cell']}.jsonl", study.label_names)
    config, start, grown = pe_config(row["seed"]), time.perf_counter(), []
    for k, name in enumerate(study.label_names):
        texts = [text for text, label in examples if label == k]
        prompts = [rewrite_prompt(study.tokenizer, config, name, text) for text in texts]
        seed = rewrite_seed(config.seed, k, config.iterations + 1)  # one more iteration after the run's last
        rewrites = sample_many(study.model, study.tokenizer, prompts, GROWTH - 1, seed, config.sampling)
        grown += [(text, k) for text in texts] + [(text, k) for group in rewrites for text in group]
        print(f"{row['cell']}: class {name} grown to {len(texts) * GROWTH}", flush=True)
    seconds = time.perf_counter() - start
    GROWN.mkdir(parents=True, exist_ok=True)
    names = study.label_names
    write_text_atomic(
        path, "".join(json.dumps({"text": t, "label": y, "label_name": names[y]}) + "\n" for t, y in grown)
    )
    return grown, seconds


def head_only(study: Study, features: tuple[torch.Tensor, torch.Tensor], seed: int) -> dict[str, float]:
    """A set's (features, classes) read two ways, test accuracy: ``grid``, the grid's head-only classifier, and
    ``converged``, the same rows fitted to convergence with the pull towards the zero-shot rows picked on the
    validation sentences (``head_steps.py``: no fit length to confound the set's size)."""
    logistic = converged(study.initial, features, study.scored)
    return {
        "grid": accuracy(fit_rows(study.initial, *features, study.probe, seed), study.scored)["test"],
        "converged": logistic[validation_chosen(logistic)]["test"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", default="*", help="grow only the n = 100 cells matching this pattern")
    args = parser.parse_args()
    out_path = HERE / "pe_grow.json"
    done = {r["cell"]: r for r in json.loads(out_path.read_text())} if out_path.exists() else {}
    study = load_study()
    rows = [r for r in study.rows if r["method"] in SOURCES and r["n_per_class"] == SIZE]
    rows = sorted(rows, key=lambda r: next(i for i, p in enumerate(ORDER) if fnmatch.fnmatch(r["cell"], p)))
    for row in rows:
        earlier = done.get(row["cell"], {})
        if "grown_converged" in earlier or not (earlier or fnmatch.fnmatch(row["cell"], args.cells)):
            continue  # read in full, or not asked for (a cell read before in part is completed whatever --cells)
        small = head_only(study, study.set_features(row), row["seed"])
        study.check_grid_fit(row, small["grid"])
        examples, seconds = grow(study, row)
        grown = head_only(study, study.features(f"pe-grow-{row['cell']}", examples), row["seed"])
        done[row["cell"]] = {
            **{k: row[k] for k in ("cell", "method", "seed", "epsilon")},
            "n100_head": small["grid"],
            "n100_converged": small["converged"],
            "grown_head": grown["grid"],
            "grown_converged": grown["converged"],
            "grown_rows": len(examples),
            "rewrite_s": round(seconds) or earlier.get("rewrite_s", 0),
        }
        print(row["cell"], {k: round(100 * done[row["cell"]][k], 1) for k in READINGS}, flush=True)
        out_path.write_text(json.dumps(sorted(done.values(), key=lambda r: r["cell"]), indent=1) + "\n")
    write_table(list(done.values()), study.rows)  # beside the grid's rows as they stand now


def write_table(out: list[dict], grid: list[dict]) -> None:
    """``pe_grow.md``: by method and ε, the n = 100 sets and the same sets grown (both fits), beside the grid's
    n = 1,000 rows (``grid``) of the method (the grid's fit)."""
    lines = [
        "# PE's n = 100 sets grown to 1,000 per class by public rewrites",
        "",
        "Head-only test accuracy in % (whole test split, 1,058), mean ± sd (seeds), two fits: the grid's (40 epochs",
        "of mini-batches of 64, so a grown set gets ten times the steps) and converged (L2 pull towards the zero-shot",
        f"rows picked on validation: `head_steps.py`). Each n = 100 set grown to {SIZE * GROWTH:,} per class: every",
        f"row and {GROWTH - 1} rewrites of it by the public model with PE's variation prompt (post-processing of the",
        "committed set: the n = 100 cell's ε, no new draw). The zero-shot rows grow texts like PE's starting",
        "population the same way, without votes. Written by `pe_grow.py`.",
        "",
        "| set | ε | n = 100, grid fit | grown, grid fit | n = 100, converged | grown, converged "
        "| the grid's n = 1,000 cell, grid fit |",
        "|---|---|---|---|---|---|---|",
    ]
    for (method, epsilon), rows in sorted(_by(out).items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        rows = [r for r in rows if "grown_converged" in r]
        if not rows:
            continue
        reference = [
            100 * r["head_accuracy"]
            for r in grid
            if r["method"] == method and r["n_per_class"] == SIZE * GROWTH and r["epsilon"] == epsilon
        ]
        readings = " | ".join(_mean_sd([100 * r[k] for r in rows]) for k in READINGS)
        eps = "–" if epsilon is None else f"{epsilon:g}"
        lines.append(f"| {method} | {eps} | {readings} | {_mean_sd(reference) if reference else 'no row yet'} |")
    (HERE / "pe_grow.md").write_text("\n".join(lines) + "\n")


def _by(out: list[dict]) -> dict[tuple[str, float | None], list[dict]]:
    found: dict[tuple[str, float | None], list[dict]] = {}
    for r in out:
        found.setdefault((r["method"], r["epsilon"]), []).append(r)
    return found


if __name__ == "__main__":
    main()
