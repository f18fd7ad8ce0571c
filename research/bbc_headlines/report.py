"""The bbc-headlines study's tables from the finished cells (and the references), against the targets.

    .venv/bin/python research/bbc_headlines/report.py

Reads ``references.json`` with ``predictions-{lead,zero_shot}.jsonl`` (``references.py``) and
``cells/<cell>.json`` with ``predictions/<cell>.jsonl`` (``run.py``); writes ``report.md`` and
``report.json``. ROUGE F1 with stemming per test article (``rouge-score``); a setting is a cell name without
its seed, its score the mean over its seeds. Paired comparisons are over the same 223 test articles: the
mean over seeds of the per-article difference, with a 95 % bootstrap interval resampling articles
(``references.paired_interval``); private-vs-private pairs share the seed (the same Poisson batches and the
same noise keys: common random numbers). Cells not run yet are listed as such, never filled in.
"""

from __future__ import annotations

import json
import re
from collections import defaultdict
from pathlib import Path

import numpy as np
from references import paired_interval

from privlm.atomic import write_text_atomic
from privlm.evaluation.generation_metrics import rouge_f1_per_row

HERE = Path(__file__).resolve().parent
KINDS = ("rouge1", "rouge2", "rougeL")
CLASSIFY = "cls-"  # BBC News classification cells (the same top-N recipe): accuracy, not ROUGE
PAIRS = (  # (a, b): a − b, paired per seed
    ("eps3-hutchinson32", "eps3-mixed", "randomized − exact clipping, ε = 3 (target: within 1 point)"),
    ("eps0.7-hutchpp32", "eps0.7-hutchinson32", "Hutch++ − Hutchinson, ε = 0.7"),
    ("eps3-hutchinson32-T2048", "eps3-hutchinson32", "T = 2,048 − T = 1,024, Hutchinson, ε = 3"),
    ("eps3-mixed", "eps30-mixed", "ε = 3 − ε = 30, exact clipping: what the extra noise costs"),
    ("eps30-mixed", "nondp", "ε = 30 − non-private: what clipping and the remaining noise cost"),
    ("clip-mixed", "nondp", "clipping without noise (σ = 0, NOT private) − non-private: what clipping costs"),
    ("eps3-mixed", "clip-mixed", "ε = 3 − clipping without noise, exact clipping: what the noise costs"),
    ("eps3-mixed-r1", "eps3-mixed", "LoRA r = 1 − r = 8 at ε = 3, exact clipping"),
)


def _predictions(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def _scores(predictions: list[dict]) -> dict[str, np.ndarray]:
    per_row = rouge_f1_per_row([p["reference"] for p in predictions], [p["generated"] for p in predictions])
    return {kind: np.asarray(values) for kind, values in per_row.items()}


def load_cells(folder: Path = HERE) -> dict[str, dict[int, tuple[dict, dict[str, np.ndarray]]]]:
    """setting → seed → (the cell's summary, per-article ROUGE F1 by kind)."""
    out: dict[str, dict[int, tuple[dict, dict[str, np.ndarray]]]] = defaultdict(dict)
    for path in sorted((folder / "cells").glob("*.json")):
        if path.stem.startswith(CLASSIFY):
            continue
        match = re.fullmatch(r"(.+)-s(\d+)", path.stem)
        if match is None:
            raise SystemExit(f"{path}: a cell name ends with -s<seed>")
        scores = _scores(_predictions(folder / "predictions" / f"{path.stem}.jsonl"))
        out[match.group(1)][int(match.group(2))] = (json.loads(path.read_text()), scores)
    return dict(out)


def _pooled(seeds: dict[int, tuple[dict, dict[str, np.ndarray]]], kind: str = "rougeL") -> np.ndarray:
    """The per-article score averaged over the setting's seeds."""
    return np.mean([seeds[s][1][kind] for s in sorted(seeds)], axis=0)


def _difference(a: np.ndarray, b: np.ndarray) -> dict[str, float | list[float]]:
    return {"points": float(100 * (a - b).mean()), "ci95": paired_interval(list(a), list(b))}


def _over_common_seeds(a: dict[int, np.ndarray], b: dict[int, np.ndarray]) -> dict | None:
    """a − b over the seeds both have (each article's score averaged over those seeds), with a paired
    interval over articles; None without a common seed."""
    common = sorted(set(a) & set(b))
    if not common:
        return None
    mean_a, mean_b = (np.mean([x[s] for s in common], axis=0) for x in (a, b))
    return {"seeds": common, **_difference(mean_a, mean_b)}


def build(folder: Path = HERE) -> dict:
    """Everything ``report.md`` shows, as JSON."""
    references = json.loads((folder / "references.json").read_text())
    fixed = {name: _scores(_predictions(folder / f"predictions-{name}.jsonl")) for name in ("lead", "zero_shot")}
    cells = load_cells(folder)
    settings = {}
    for name, seeds in sorted(cells.items()):
        summaries = [seeds[s][0] for s in sorted(seeds)]
        pooled = _pooled(seeds)
        settings[name] = {
            "seeds": sorted(seeds),
            "rougeL_per_seed": [float(100 * seeds[s][1]["rougeL"].mean()) for s in sorted(seeds)],
            **{kind: float(100 * _pooled(seeds, kind).mean()) for kind in KINDS},
            "epsilon": summaries[0]["epsilon"] if summaries[0]["private"] else None,  # NOT private: no ε
            "noise_multiplier": summaries[0]["noise_multiplier"],
            "steps": summaries[0]["steps"],
            "train_wall_s": [s["train_wall_s"] for s in summaries],
            "cell_wall_s": [s["cell_wall_s"] for s in summaries],
            "peak_rss_mb": [s["peak_rss_mb"] for s in summaries],
            "vs_lead": _difference(pooled, fixed["lead"]["rougeL"]),
            "vs_zero_shot": _difference(pooled, fixed["zero_shot"]["rougeL"]),
            "commands": [s["command"] for s in summaries],
        }
        if "nondp" in cells and name != "nondp":
            settings[name]["vs_nondp"] = _difference(pooled, _pooled(cells["nondp"]))
    pairs = []
    for a, b, what in PAIRS:
        rouge = ({s: v[1]["rougeL"] for s, v in cells.get(name, {}).items()} for name in (a, b))
        pair = _over_common_seeds(*rouge)
        if pair is not None:
            pairs.append({"a": a, "b": b, "what": what, **pair})
    return {
        "classification": _classification(folder),
        "references": {name: {kind: float(100 * fixed[name][kind].mean()) for kind in KINDS} for name in fixed},
        "zero_shot_prompt": references["zero_shot_prompt_chosen"],
        "n_test": len(fixed["lead"]["rougeL"]),
        "settings": settings,
        "pairs": pairs,
        "targets": _targets(settings, pairs),
    }


def _classification(folder: Path) -> dict:
    """The ``cls-`` cells: test accuracy each, and randomized − exact over the seeds both have (each article's
    correctness averaged over those seeds), with a paired interval over articles."""
    cells = {}
    for path in sorted((folder / "cells").glob(f"{CLASSIFY}*.json")):
        rows = _predictions(folder / "predictions" / f"{path.stem}.jsonl")
        summary = json.loads(path.read_text())
        correct = np.array([r["gold"] == r["predicted"] for r in rows], dtype=float)
        cells[path.stem] = {"accuracy": float(100 * correct.mean()), "epsilon": summary["epsilon"], "correct": correct}
    out: dict = {name: {k: v for k, v in c.items() if k != "correct"} for name, c in cells.items()}
    randomized, exact = (
        {int(name[len(prefix) :]): c["correct"] for name, c in cells.items() if name.startswith(prefix)}
        for prefix in (f"{CLASSIFY}eps3-{mode}-s" for mode in ("hutchinson32", "mixed"))
    )
    pair = _over_common_seeds(randomized, exact)
    if pair is not None:
        out["hutchinson_minus_mixed"] = pair
    return out


def _targets(settings: dict, pairs: list[dict]) -> list[str]:
    """The study's targets, each met / missed (by how much) / not measured yet."""
    lines = []
    # the recipe's two ε = 3 cells; ablations (another rank, T or σ) are read in the pairs table
    private = {n: settings[n] for n in ("eps3-hutchinson32", "eps3-mixed") if n in settings}
    if not private:
        return ["ε = 3 private cells: not run yet"]
    for name, s in sorted(private.items()):
        for ref in ("lead", "zero_shot"):
            d = s[f"vs_{ref}"]
            met = d["points"] >= 2 and d["ci95"][0] > 0
            lines.append(
                f"{name} − {ref}: {d['points']:+.1f} ROUGE-L points, 95 % [{d['ci95'][0]:+.1f}, {d['ci95'][1]:+.1f}] "
                f"(target ≥ +2 with the interval above 0): {'met' if met else 'missed'}"
            )
        if "vs_nondp" in s:
            d = s["vs_nondp"]
            lines.append(
                f"{name} − non-private: {d['points']:+.1f} points (target within 3): "
                f"{'met' if d['points'] >= -3 else 'missed by ' + format(-3 - d['points'], '.1f')}"
            )
    for pair in pairs:
        if pair["a"] == "eps3-hutchinson32":
            low, high = pair["ci95"]
            lines.append(
                f"randomized − exact at ε = 3: {pair['points']:+.2f} points, 95 % [{low:+.2f}, {high:+.2f}] over "
                f"{len(pair['seeds'])} seed(s) (target within 1 point): "
                f"{'met' if abs(pair['points']) <= 1 else 'missed'}"
            )
    return lines


def markdown(result: dict) -> str:
    refs = result["references"]
    lines = [
        "# bbc-headlines: finished cells",
        "",
        f"Test split, {result['n_test']} articles, ROUGE F1 (stemmed) in points; seeds averaged. Written by "
        "`report.py` from `cells/` and `predictions/`.",
        "",
        "| setting | seeds | ROUGE-1 | ROUGE-2 | ROUGE-L (per seed) | − lead (95 %) | − zero-shot (95 %) | ε | steps | train s |",
        "|---|---|---|---|---|---|---|---|---|---|",
        f"| lead sentence (no model) | – | {refs['lead']['rouge1']:.1f} | {refs['lead']['rouge2']:.1f} | "
        f"{refs['lead']['rougeL']:.1f} | | | – | – | – |",
        f"| zero-shot ({result['zero_shot_prompt']} prompt) | – | {refs['zero_shot']['rouge1']:.1f} | "
        f"{refs['zero_shot']['rouge2']:.1f} | {refs['zero_shot']['rougeL']:.1f} | | | – | – | – |",
    ]
    for name, s in result["settings"].items():
        per_seed = ", ".join(f"{x:.1f}" for x in s["rougeL_per_seed"])
        lead, zero = s["vs_lead"], s["vs_zero_shot"]
        eps = "∞ (non-private)" if s["epsilon"] is None else f"{s['epsilon']:.2f}"
        lines.append(
            f"| {name} | {len(s['seeds'])} | {s['rouge1']:.1f} | {s['rouge2']:.1f} | {s['rougeL']:.1f} ({per_seed}) | "
            f"{lead['points']:+.1f} [{lead['ci95'][0]:+.1f}, {lead['ci95'][1]:+.1f}] | "
            f"{zero['points']:+.1f} [{zero['ci95'][0]:+.1f}, {zero['ci95'][1]:+.1f}] | {eps} | {s['steps']} | "
            f"{', '.join(str(round(t)) for t in s['train_wall_s'])} |"
        )
    if result["pairs"]:
        lines += ["", "| pair (same seeds) | seeds | difference (ROUGE-L points) | 95 % |", "|---|---|---|---|"]
        for p in result["pairs"]:
            lines.append(
                f"| {p['what']} | {len(p['seeds'])} | {p['points']:+.2f} | [{p['ci95'][0]:+.2f}, {p['ci95'][1]:+.2f}] |"
            )
    cls = result["classification"]
    if cls:
        lines += ["", "BBC News classification, the same top-2-block LoRA recipe (test accuracy, %):", ""]
        lines += [f"- {name}: {c['accuracy']:.1f} (ε {c['epsilon']:.2f})" for name, c in cls.items() if "accuracy" in c]
        if "hutchinson_minus_mixed" in cls:
            d = cls["hutchinson_minus_mixed"]
            lines.append(
                f"- randomized − exact ({len(d['seeds'])} seeds): {d['points']:+.2f} points, "
                f"95 % [{d['ci95'][0]:+.2f}, {d['ci95'][1]:+.2f}] (the paper: within 0.7)"
            )
    lines += ["", "Targets:", ""] + [f"- {t}" for t in result["targets"]]
    lines += ["", "Commands (one per finished cell):", ""]
    for s in result["settings"].values():
        lines += [f"- `{c}`" for c in s["commands"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    result = build()
    write_text_atomic(HERE / "report.json", json.dumps(result, indent=2) + "\n")
    write_text_atomic(HERE / "report.md", markdown(result))
    print(markdown(result))


if __name__ == "__main__":
    main()
