"""Ablation: the DP labellers that chose the label-filter sets, scored themselves.

``gradmm@filter`` draws among the candidates that the release's one-step head ``R(t)`` gives their class, and
``dp-head-pool`` among those that a head-only classifier DP-SGD trained on the private sentences gives theirs. A
set chosen by a labeller can teach the downstream head at most what the labeller knows, so this script scores
each labeller on the whole test split (1,058 sentences), in the layout it labels candidates in (GRADMM's
``prefix + text + suffix``, texts cut to the factors' 48 tokens), beside the head-only score of the set it chose.
No new draw: every labeller is a DP release already accounted for (reading it is post-processing), and the
filter's step ``t`` is the one the cell chose (``filter-step.json``). The noise-only releases' steps are their
controls.

    python research/synthetic_at_scale/labellers.py   # writes labellers.json, labellers.md

Reads the cells' releases, labeller rows and head-only readings under ``work/`` (git-ignored; the head-only
reading of a finished cell is its row in ``results.jsonl``).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch

from privlm.experiments.config import load_config
from privlm.experiments.sampling import subsample
from privlm.resources.datasets import load_dataset
from privlm.resources.models import load_model
from privlm.synthesis.gradmm.config import make_config
from privlm.synthesis.gradmm.prompt import build_prompt
from privlm.synthesis.gradmm.release import Release, private_factors
from privlm.synthesis.gradmm.release_filter import label_rows_and_direction, stepped_rows
from privlm.training.head import label_word_rows

HERE = Path(__file__).resolve().parent
WORK = HERE / "work"


def set_score(cell: str) -> float | None:
    """The head-only test accuracy (%) of a cell's set: its row, else its cached reading, else None."""
    for line in (HERE / "results.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["cell"] == cell and "head_accuracy" in row:
            return 100 * row["head_accuracy"]
    found = sorted((WORK / cell / "evaluation").glob("head-only-*.json"))
    return 100 * json.loads(found[0].read_text())["head_accuracy"] if found else None


def labellers(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every labeller on this machine by cell: the filter cells' ``R(t)`` and dp-head-pool's trained rows."""
    found = {}
    for cell in sorted(p.name for p in WORK.glob("gradmm@filter*_n1000_*") if p.is_dir()):
        gradmm = WORK / cell / "synthetic.jsonl.gradmm"
        if (gradmm / "batches" / "filter-step.json").exists():
            release = Release.load(gradmm / "release.pt")
            t = json.loads((gradmm / "batches" / "filter-step.json").read_text())["step"]
            found[cell] = stepped_rows(*label_rows_and_direction(model, release), t)
    for cell in sorted(p.name for p in WORK.glob("dp-head-pool_n1000_*") if p.is_dir()):
        sidecar = json.loads((WORK / cell / "synthetic.privacy.json").read_text())
        found[cell] = torch.load((WORK / cell / sidecar["ledger_file"]).parent / "labeller.pt", weights_only=True)
    return found


def main() -> None:
    torch.set_num_threads(1)
    config = load_config(HERE / "config.toml")
    spec, seed0 = config.data_spec(), config.data_seed
    train = load_dataset(spec, split="train", seed=seed0, labels=config.labels)
    test = subsample(load_dataset(spec, split="test", seed=seed0, labels=config.labels).examples, None, seed0)
    model, tokenizer = load_model(config.model, seed=seed0)
    model.requires_grad_(False)
    verbalizer = train.verbalizer
    prompt = build_prompt(tokenizer, verbalizer.template, verbalizer.label_words, train.label_names)
    max_tokens = make_config("instruct").max_private_tokens
    scored = private_factors(model, tokenizer, [(text, label) for text, label in test], prompt, max_tokens=max_tokens)
    hidden, classes = scored.hidden.to(torch.float64), scored.labels

    def accuracy(rows: torch.Tensor) -> float:
        return 100 * float(((hidden @ rows.T).argmax(dim=1) == classes).double().mean())

    start = label_word_rows(model, prompt.label_token_ids)
    out = {"zero_shot_rows": accuracy(start.to(torch.float64)), "test_sentences": len(test), "labellers": []}
    for cell, rows in labellers(model).items():
        out["labellers"].append(
            {"cell": cell, "labeller_test": accuracy(rows.to(torch.float64)), "set_head_only": set_score(cell)}
        )
    (HERE / "labellers.json").write_text(json.dumps(out, indent=1) + "\n")
    lines = [
        "# The DP labellers that chose the label-filter sets, scored themselves (written by `labellers.py`)",
        "",
        f"Test accuracy in % on the whole test split ({len(test):,} sentences) of each labeller, in the layout it "
        f"labels candidates in, beside the head-only score of the set it chose. The zero-shot rows score "
        f"{out['zero_shot_rows']:.1f}.",
        "",
        "| cell | labeller on test | its set, head-only |",
        "|---|---|---|",
    ]
    for entry in out["labellers"]:
        score = "–" if entry["set_head_only"] is None else f"{entry['set_head_only']:.1f}"
        lines.append(f"| {entry['cell']} | {entry['labeller_test']:.1f} | {score} |")
    by_method: dict[str, list[float]] = {}
    for entry in out["labellers"]:
        by_method.setdefault(entry["cell"].split("_n1000")[0] + entry["cell"][-5:], []).append(entry["labeller_test"])
    lines += [
        "",
        "Means over seeds: " + "; ".join(f"{k} {statistics.mean(v):.1f} ({len(v)})" for k, v in by_method.items()),
        "",
    ]
    (HERE / "labellers.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
