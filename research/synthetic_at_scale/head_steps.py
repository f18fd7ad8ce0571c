"""Ablation: how a set's head-only score depends on how long the head is fitted.

The grid's head-only classifier fits the label-word rows for a fixed 40 epochs in mini-batches of 64, so a set of
n = 1,000 per class takes ten times the optimizer steps of n = 100 (1,280 against 160). On real sentences more
steps help; on synthetic ones they may fit the set's own quirks (a shift away from the test distribution). This
script refits the head on every finished cell's committed set for several epoch counts (everything else as in
the grid: the same model, features, seed, AdamW settings and whole test split), and also picks the epoch
count on the 100 validation sentences the fine-tune already uses to pick its epoch (real, from the validation
split; never the test split). The 40-epoch refit must reproduce the row's ``head_accuracy``: it is checked.

    python research/synthetic_at_scale/head_steps.py   # writes head_steps.json, head_steps.md, plots/head_steps.png
    python research/synthetic_at_scale/head_steps.py --cells "pe_n1000_*"   # refits those cells only, kept beside
                                                       # the other cells already in head_steps.json

Costs the features of every set once (about 5 min per n = 1,000 set on one core), kept under
``work/head-steps/`` (git-ignored; the ``random`` cells' features are of real rows: private). Not a DP
mechanism: it reads released sets (and the NOT private random reference) and the public splits.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from privlm.experiments.config import load_config  # noqa: E402
from privlm.experiments.records import read_training_set  # noqa: E402
from privlm.experiments.sampling import subsample  # noqa: E402
from privlm.resources.datasets import load_dataset  # noqa: E402
from privlm.resources.models import load_model  # noqa: E402
from privlm.training.head import label_token_ids, label_word_rows  # noqa: E402
from privlm.training.head_probe import fit_rows, prompt_features  # noqa: E402
from privlm.training.head_probe_config import HeadProbeConfig  # noqa: E402

HERE = Path(__file__).resolve().parent
CACHE = HERE / "work" / "head-steps"
EPOCHS = (1, 2, 5, 10, 20, 40, 80)
STRENGTHS = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1, 1.0)  # the converged fit's L2 pull towards the zero-shot rows
GRID_EPOCHS = 40  # the grid's setting (config.toml: head_probe = true, the defaults)


@dataclass
class Study:
    """What both head ablations read: the finished rows whose sets are committed, the grid's head settings,
    the zero-shot label-word rows, the label names and the features (with classes) of the validation and
    test splits (``scored``); :meth:`features` gives (and caches under ``work/head-steps/``) a set's."""

    rows: list[dict]
    probe: HeadProbeConfig
    label_names: tuple[str, ...]
    initial: torch.Tensor
    scored: dict[str, tuple[torch.Tensor, torch.Tensor]]
    model: Any
    tokenizer: Any
    template: str

    def features(self, name: str, examples: list) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt features (n, d) and classes (n,) of ``examples``, cached as ``work/head-steps/<name>.pt``
        (private: a ``random`` cell's are of real rows)."""
        path = CACHE / f"{name}.pt"
        if path.exists():
            return torch.load(path, weights_only=True)
        texts = [t for t, _ in examples]
        value = (
            prompt_features(self.model, self.tokenizer, texts, self.template, self.probe.max_length),
            torch.tensor([y for _, y in examples], dtype=torch.long),
        )
        CACHE.mkdir(parents=True, exist_ok=True)
        torch.save(value, path)
        return value

    def set_features(self, row: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The features of the finished cell ``row``'s committed set, in its file's order."""
        return self.features(row["cell"], read_training_set(HERE / "sets" / f"{row['cell']}.jsonl", self.label_names))

    def check_grid_fit(self, row: dict, test: float) -> None:
        """Stop unless ``test``, the 40-epoch refit on the whole set, is the row's ``head_accuracy``."""
        if abs(test - row["head_accuracy"]) > 1e-12:
            raise SystemExit(
                f"{row['cell']}: the 40-epoch refit scores {test}, "
                f"the grid's row {row['head_accuracy']}: not the grid's head-only classifier"
            )


def load_study() -> Study:
    """The model, splits and finished rows of the grid, with its head-only settings checked."""
    torch.set_num_threads(1)
    config = load_config(HERE / "config.toml")
    probe = config.head_probe_config()
    assert probe is not None and probe.epochs == GRID_EPOCHS, "the grid's head-only settings changed"
    rows = [json.loads(line) for line in (HERE / "results.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if (HERE / "sets" / f"{r['cell']}.jsonl").exists()]
    spec, seed0 = config.data_spec(), config.data_seed
    train = load_dataset(spec, split="train", seed=seed0, labels=config.labels)
    valid = load_dataset(spec, split="validation", seed=seed0, labels=config.labels).examples
    splits = {
        "validation": subsample(valid, config.validation_size, seed0),
        "test": subsample(load_dataset(spec, split="test", seed=seed0, labels=config.labels).examples, None, seed0),
    }
    model, tokenizer = load_model(config.model, seed=seed0)
    initial = label_word_rows(model, label_token_ids(tokenizer, train.verbalizer))
    study = Study(rows, probe, tuple(train.label_names), initial, {}, model, tokenizer, train.verbalizer.template)
    study.scored = {name: study.features(name, examples) for name, examples in splits.items()}
    return study


def accuracy(rows: torch.Tensor, scored: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> dict[str, float]:
    """Accuracy of the label-word ``rows`` on each scored split."""
    return {name: float(((f @ rows.T).argmax(1) == y).double().mean()) for name, (f, y) in scored.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--cells",
        help="refit only the finished cells matching this pattern (fnmatch), keeping "
        "the other cells' entries already in head_steps.json",
    )
    cells = parser.parse_args().cells
    study = load_study()
    probe, initial, scored = study.probe, study.initial, study.scored
    saved = json.loads((HERE / "head_steps.json").read_text()) if cells else []
    for entry in saved:  # JSON keys are strings: the epoch counts back to ints
        entry["by_epochs"] = {int(e): v for e, v in entry["by_epochs"].items()}
    out = [r for r in saved if not fnmatch.fnmatchcase(r["cell"], cells)] if cells else []
    for row in study.rows:
        if cells and not fnmatch.fnmatchcase(row["cell"], cells):
            continue
        set_features = study.set_features(row)
        by_epochs = {}
        for epochs in EPOCHS:
            fitted = fit_rows(initial, *set_features, replace(probe, epochs=epochs), row["seed"])
            by_epochs[epochs] = {
                **accuracy(fitted, scored),
                "steps": epochs * -(-len(set_features[0]) // probe.batch_size),
            }
        study.check_grid_fit(row, by_epochs[GRID_EPOCHS]["test"])
        chosen = max(EPOCHS, key=lambda e: (by_epochs[e]["validation"], -e))  # fewest epochs on ties
        logistic = converged(initial, set_features, scored)
        strength = validation_chosen(logistic)
        out.append(
            {
                "cell": row["cell"],
                "method": row["method"],
                "n_per_class": row["n_per_class"],
                "seed": row["seed"],
                "epsilon": row["epsilon"],
                "by_epochs": by_epochs,
                "validation_chosen_epochs": chosen,
                "validation_chosen_test": by_epochs[chosen]["test"],
                "logistic": logistic,
                "logistic_chosen_c": strength,
                "logistic_chosen_test": logistic[strength]["test"],
            }
        )
        print(row["cell"], {e: round(100 * v["test"], 1) for e, v in by_epochs.items()}, "chosen", chosen, flush=True)
    (HERE / "head_steps.json").write_text(json.dumps(out, indent=1) + "\n")
    write_table(out)
    plot(out)


def converged(
    initial: torch.Tensor, train: tuple[torch.Tensor, torch.Tensor], scored: dict
) -> dict[float, dict[str, float]]:
    """The grid's model class and starting point fitted to convergence (:func:`fit_converged`) for each λ; test
    and validation accuracy."""
    return {strength: accuracy(fit_converged(initial, train, strength), scored) for strength in STRENGTHS}


def fit_converged(initial: torch.Tensor, train: tuple[torch.Tensor, torch.Tensor], strength: float) -> torch.Tensor:
    """The label-word rows R (K, d) fitted from the zero-shot rows R0 by full-batch L-BFGS on mean cross-entropy
    + λ/2 ‖R − R0‖² over ``train`` (features (n, d), classes (n,)): the pull towards the zero-shot classifier
    replaces early stopping."""
    features, classes = train
    start = initial.detach().double()
    rows = start.clone().requires_grad_(True)
    optimizer = torch.optim.LBFGS([rows], max_iter=2000, tolerance_grad=1e-10, line_search_fn="strong_wolfe")

    def objective() -> torch.Tensor:
        optimizer.zero_grad()
        loss = F.cross_entropy(features @ rows.T, classes) + strength / 2 * (rows - start).pow(2).sum()
        loss.backward()
        return loss

    optimizer.step(objective)
    return rows.detach()


def validation_chosen(logistic: dict[float, dict[str, float]]) -> float:
    """The pull strength of :func:`converged` with the best validation accuracy (the strongest pull on ties)."""
    return max(logistic, key=lambda c: (logistic[c]["validation"], c))


def write_table(out: list[dict]) -> None:
    lines = [
        "# Head-only score against how long the head is fitted",
        "",
        "Test accuracy in % (whole test split, 1,058) of the head-only classifier refitted on each committed set "
        f"for E epochs (mini-batches of 64; the grid uses E = {GRID_EPOCHS}); `val-chosen`: E picked on the 100 "
        "validation sentences. Written by `head_steps.py`.",
        "",
        "| cell | " + " | ".join(f"E = {e}" for e in EPOCHS) + " | val-chosen (E) | converged, val-chosen (λ) |",
        "|---|" + "---|" * (len(EPOCHS) + 2),
    ]
    for r in sorted(out, key=lambda r: (r["n_per_class"], r["method"], r["seed"])):
        cells = " | ".join(f"{100 * r['by_epochs'][e]['test']:.1f}" for e in EPOCHS)
        lines.append(
            f"| {r['cell']} | {cells} | {100 * r['validation_chosen_test']:.1f} ({r['validation_chosen_epochs']}) "
            f"| {100 * r['logistic_chosen_test']:.1f} ({r['logistic_chosen_c']:g}) |"
        )
    (HERE / "head_steps.md").write_text("\n".join(lines) + "\n")


def plot(out: list[dict]) -> None:
    fig, ax = plt.subplots(figsize=(8, 5))
    for r in sorted(out, key=lambda r: r["cell"]):
        steps = [r["by_epochs"][e]["steps"] for e in EPOCHS]
        tests = [100 * r["by_epochs"][e]["test"] for e in EPOCHS]
        ax.plot(steps, tests, "-" if r["n_per_class"] == 1000 else "--", marker="o", ms=3, label=r["cell"])
    ax.set_xscale("log")
    ax.set_xlabel("optimizer steps of the head fit (log)")
    ax.set_ylabel("head-only test accuracy (%)")
    ax.set_title("Head-only score against fit length (solid: n = 1,000; dashed: n = 100)")
    ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(HERE / "plots" / "head_steps.png", dpi=120)


if __name__ == "__main__":
    main()
