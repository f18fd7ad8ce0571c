"""Ablation: what `dp-head-pool`'s noise-only control would be, and why the grid reads it against the pool's draw.

A noise-only control runs a DP mechanism at the same σ on no signal, so that what remains of a result is what the
public inputs give. For `dp-head-pool` that is the labeller's DP-SGD run (the DP-direct recipe: 40 epochs over
8,453 examples at expected batch 512, AdamW lr 0.01, clip 1, ε = 1) on zero hidden states: every clipped sum is 0
and each step is Gaussian noise alone (`privlm.synthesis.dp_head_pool.labeller.noise_labeller`, the method's
``noise_only = true``). This script draws three such labellers (noise from the OS; they read no private data,
only the pool's size, so they spend nothing) and measures each one:

- how far it moved from the zero-shot rows it starts at (‖R − R0‖ / ‖R0‖);
- its accuracy on the whole test split, and the share of test sentences it calls positive;
- how many of the public label-filtered candidates it gives their own class, per class, and so the size of the
  set it could draw at n = 1,000 per class (`head_draw` takes at most the fewer class's count; none is refused).

The zero-shot rows are measured the same way. Writes noise_labeller.json and noise_labeller.md.

    python research/synthetic_at_scale/noise_labeller.py

Needs the public pool's hidden states under ``work/public-candidates`` (`public_pool.py hidden`, run by run.sh).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import torch
from public_pool import in_cell_order, setting  # the study's own script, beside this one

from privlm.experiments.config import load_config
from privlm.experiments.sampling import subsample
from privlm.resources.datasets import load_dataset
from privlm.synthesis.dp_head_pool.labeller import LabellerConfig, noise_labeller
from privlm.synthesis.gradmm.generate import public_labels
from privlm.synthesis.gradmm.head_select import eligible_hidden
from privlm.synthesis.gradmm.release import private_factors
from privlm.training.head import label_word_rows

HERE = Path(__file__).resolve().parent
DRAWS = 3
EPSILON = 1.0
N = 1000


def main() -> None:
    torch.set_num_threads(1)
    config = load_config(HERE / "config.toml")
    model, tokenizer, prompt, gradmm, public, n = setting()
    spec, seed0 = config.data_spec(), config.data_seed
    size = len(load_dataset(spec, split="train", seed=seed0, labels=config.labels).examples)
    test = subsample(load_dataset(spec, split="test", seed=seed0, labels=config.labels).examples, None, seed0)
    scored = private_factors(model, tokenizer, [(t, y) for t, y in test], prompt, max_tokens=gradmm.max_private_tokens)
    test_hidden, test_classes = scored.hidden.to(torch.float64), scored.labels
    candidates = in_cell_order(tokenizer, prompt, gradmm, public, n)
    predicted = public_labels(model, tokenizer, prompt, candidates, public)
    pool, hidden = eligible_hidden(model, prompt, candidates, predicted, public)
    start = label_word_rows(model, prompt.label_token_ids).to(torch.float64)

    def measure(name: str, rows: torch.Tensor) -> dict:
        rows = rows.to(torch.float64)
        called = (test_hidden @ rows.T).argmax(dim=1)
        agreed = [int(((h @ rows.T).argmax(dim=1) == k).sum()) for k, h in enumerate(hidden)]
        return {
            "labeller": name,
            "moved": float((rows - start).norm() / start.norm()),
            "test_accuracy": 100 * float((called == test_classes).double().mean()),
            "test_called_positive": 100 * float(called.double().mean()),
            "agreed_per_class": agreed,
            "set_per_class_at_n1000": min(N, *agreed),
        }

    out = {
        "epsilon": EPSILON,
        "delta": config.delta,
        "recipe": LabellerConfig().to_dict(),
        "pool_size": size,
        "eligible_per_class": [len(p) for p in pool],
        "test_sentences": len(test),
        "labellers": [measure("zero-shot rows", start)],
    }
    for draw in range(DRAWS):
        rows, _ = noise_labeller(model, prompt, size, epsilon=EPSILON, delta=config.delta, config=LabellerConfig())
        out["labellers"].append(measure(f"noise-only draw {draw}", rows))
    (HERE / "noise_labeller.json").write_text(json.dumps(out, indent=1) + "\n")
    write_table(out)


def write_table(out: dict) -> None:
    """noise_labeller.md from the measured numbers."""
    eligible = out["eligible_per_class"]
    lines = [
        "# dp-head-pool's noise-only control: a random head (written by `noise_labeller.py`)",
        "",
        f"The labeller's DP-SGD run at ε = {out['epsilon']:g} (the DP-direct recipe) on {out['pool_size']:,} zero "
        "hidden states: pure noise, no private data read. Test: the whole test split "
        f"({out['test_sentences']:,} sentences). The public label filter keeps {eligible[0]:,} negative and "
        f"{eligible[1]:,} positive candidates; a labeller's set at n = 1,000 holds at most the fewer of the two "
        "counts it agrees with, per class.",
        "",
        "| labeller | moved ‖R − R0‖/‖R0‖ | on test | test called positive | candidates it agrees with (neg, pos) "
        "| set per class at n = 1,000 |",
        "|---|---|---|---|---|---|",
    ]
    for e in out["labellers"]:
        neg, pos = e["agreed_per_class"]
        lines.append(
            f"| {e['labeller']} | {e['moved']:.2f} | {e['test_accuracy']:.1f} | {e['test_called_positive']:.1f} % "
            f"| {neg:,}, {pos:,} | {e['set_per_class_at_n1000']:,} |"
        )
    noise = [e for e in out["labellers"] if e["labeller"].startswith("noise")]
    lines += [
        "",
        f"Noise-only draws: mean test accuracy {statistics.mean(e['test_accuracy'] for e in noise):.1f}, mean move "
        f"{statistics.mean(e['moved'] for e in noise):.2f} × the zero-shot rows' norm.",
        "",
    ]
    (HERE / "noise_labeller.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
