"""Ablation: how a set's head-only score grows with its size, read from the prefixes of the committed n = 1,000 sets.

Each method writes its rows class by class in an order that makes a prefix a smaller set of the same method:
GRADMM's greedy matching writes its picks in the order chosen, so the first k rows of each class are exactly the
set GRADMM selects at n = k from the same release and pool (no new draw: no privacy spent); a random coreset's
prefix is a random sample of k; zero-shot generation and dp-finetune-gen write their samples as drawn. So the
prefixes show, at no cost in ε, whether more rows of one method add signal the head-only classifier can use, and
whether the head-only target (DP training directly, 82.3 %) is missed for want of rows or for their kind.

Every prefix is fitted two ways: the grid's recipe (AdamW, 40 epochs of mini-batches of 64: a prefix of k rows per
class gets k / 1,000 of the full set's steps, as the grid's own n = 100 cells do) and converged (L-BFGS with an
L2 pull towards the zero-shot rows, its strength picked on the 100 validation sentences: no fit length to
confound the size; ``head_steps.py``). The 40-epoch fit of the whole set must reproduce the row's
``head_accuracy``: it is checked.

    python research/synthetic_at_scale/head_sizes.py   # writes head_sizes.json, head_sizes.md, plots/head_sizes.png

Reads the set features ``head_steps.py`` caches under ``work/head-steps/`` (about 5 min per n = 1,000 set on one
core when absent). Not a DP mechanism: it reads released sets (and the NOT private random reference) and the
public splits.
"""

from __future__ import annotations

import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from head_steps import GRID_EPOCHS, HERE, accuracy, converged, load_study, validation_chosen  # noqa: E402
from report import _mean_sd, direct  # noqa: E402

from privlm.training.head_probe import fit_rows  # noqa: E402

SIZES = (50, 100, 200, 500, 1000)  # rows per class


def prefix(classes: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the first ``k`` rows of each class, in file order."""
    return torch.cat([(classes == c).nonzero().flatten()[:k] for c in classes.unique(sorted=True)]).sort().values


def main() -> None:
    study = load_study()
    out = []
    for row in study.rows:
        if row["n_per_class"] != max(SIZES):
            continue
        features, classes = study.set_features(row)
        by_size = {}
        for k in SIZES:
            keep = prefix(classes, k)
            grid = accuracy(
                fit_rows(study.initial, features[keep], classes[keep], study.probe, row["seed"]), study.scored
            )
            logistic = converged(study.initial, (features[keep], classes[keep]), study.scored)
            strength = validation_chosen(logistic)
            by_size[k] = {"grid": grid["test"], "converged": logistic[strength]["test"], "converged_c": strength}
        study.check_grid_fit(row, by_size[max(SIZES)]["grid"])
        out.append({k: row[k] for k in ("cell", "method", "seed", "epsilon")} | {"by_size": by_size})
        print(row["cell"], {k: round(100 * v["grid"], 1) for k, v in by_size.items()}, flush=True)
    (HERE / "head_sizes.json").write_text(json.dumps(out, indent=1) + "\n")
    write_table(out)
    plot(out)


def _means(out: list[dict]) -> dict[tuple[str, float | None], dict[int, dict[str, list[float]]]]:
    """By (method, ε), by size: the seeds' test accuracies (%) of each fit."""
    found: dict = defaultdict(lambda: defaultdict(lambda: defaultdict(list)))
    for r in out:
        for k, v in r["by_size"].items():
            for fit in ("grid", "converged"):
                found[r["method"], r["epsilon"]][int(k)][fit].append(100 * v[fit])
    return found


def _eps(epsilon: float | None) -> str:
    return "none" if epsilon is None else f"{epsilon:g}"


def write_table(out: list[dict]) -> None:
    lines = [
        "# Head-only score against set size (prefixes of the n = 1,000 sets)",
        "",
        "Test accuracy in % (whole test split, 1,058), mean ± sd (seeds), of the head-only classifier fitted on the "
        "first k rows per class of each committed n = 1,000 set (GRADMM's prefix is its own n = k selection from "
        f"the same release). `grid`: the grid's recipe ({GRID_EPOCHS} epochs); `converged`: L-BFGS to convergence, "
        "pull strength picked on the 100 validation sentences. Written by `head_sizes.py`.",
        "",
        "| method | ε | fit | " + " | ".join(f"k = {k:,}" for k in SIZES) + " |",
        "|---|---|---|" + "---|" * len(SIZES),
    ]
    for (method, epsilon), sizes in sorted(_means(out).items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
        for fit in ("grid", "converged"):
            cells = " | ".join(_mean_sd(sizes[k][fit]) for k in SIZES)
            lines.append(f"| {method} | {_eps(epsilon)} | {fit} | {cells} |")
    lines += [
        "",
        f"The target's reference, DP training directly on the real split (head-only, ε = 1): {_mean_sd(direct()[1.0])}.",
    ]
    (HERE / "head_sizes.md").write_text("\n".join(lines) + "\n")


def plot(out: list[dict]) -> None:
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5), sharey=True)
    for ax, fit in zip(axes, ("grid", "converged"), strict=True):
        for (method, epsilon), sizes in sorted(_means(out).items(), key=lambda kv: (kv[0][0], kv[0][1] or 0)):
            means = [sum(sizes[k][fit]) / len(sizes[k][fit]) for k in SIZES]
            ax.plot(SIZES, means, marker="o", ms=3, label=f"{method} (ε {_eps(epsilon)})")
        reference = direct()[1.0]
        ax.axhline(sum(reference) / len(reference), color="black", ls="--", lw=1, label="DP training directly, ε 1")
        ax.set_xscale("log")
        ax.set_xlabel("rows per class (prefix of the n = 1,000 set, log)")
        ax.set_title(f"head fit: {fit}")
    axes[0].set_ylabel("head-only test accuracy (%, seed mean)")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(HERE / "plots" / "head_sizes.png", dpi=120)


if __name__ == "__main__":
    main()
