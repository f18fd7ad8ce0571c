"""Does GRADMM's DP release carry the private data's signal?

    OMP_NUM_THREADS=1 python research/synthetic_full_split/release_diagnostics.py \
        --out research/synthetic_full_split/release_diagnostics.json

SmolLM2-135M, Rotten Tomatoes (data seed 0), the demo preset's ``max_private_tokens`` (48), C = 1,
δ = 1e-5. For each release kind (``label-rows``, ``full``) and private set (the synthetic_pool50 pool of 50 per
class; the whole train split):

1. **Signal vs noise** — per class, the norm of the clipped sum (the signal, ≤ n·C) and the public noise
   norm ``σ·C·√(|R|·d)`` at each ε;
2. **What survives DP** — ``cos(DP target, no-DP target)`` per class over independent draws (mean and
   min), at ε ∈ {4, 1}; the no-DP target is the unclipped sum (what ``--no-dp`` releases); also against
   the clipped noiseless sum, which isolates the noise from the clipping;
3. **Class signal** — on validation texts (never in any release), the per-example matching loss
   against each class target in the released rows: the AUC with which a low loss picks out the text's
   class, and of the contrastive score ``loss_other − loss_own``, for the no-DP target, one ε = 1
   release, and one noise-only release (the control: AUC ≈ 0.5 expected).

This is analysis, not a release: it reads the private data without noise and prints statistics of it,
like the grid's no-DP cells; nothing it computes feeds any other run.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score

from privlm.experiments.sampling import per_class_indices
from privlm.resources.datasets import load_dataset
from privlm.resources.models import load_model
from privlm.synthesis.gradmm.config import RELEASES, make_config
from privlm.synthesis.gradmm.matching import per_example_matching_loss
from privlm.synthesis.gradmm.prompt import Prompt, build_prompt, head_logits
from privlm.synthesis.gradmm.release import (
    PrivateFactors,
    draw_release,
    factor_class_sums,
    private_factors,
    released_rows,
)

EPSILONS = (4.0, 1.0)
DELTA = 1e-5


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    return float(F.cosine_similarity(a.flatten().double(), b.flatten().double(), dim=0))


def survival(model, prompt: Prompt, factors: PrivateFactors, rows, draws: int) -> dict:
    """Signal and noise norms, and the cosine of DP targets with the no-DP and the clipped noiseless sums."""
    plain = factor_class_sums(model, factors, prompt, clip=None, rows=rows)
    clipped = factor_class_sums(model, factors, prompt, clip=1.0, rows=rows)
    out: dict = {
        "examples_per_class": [int((factors.labels == k).sum()) for k in range(len(prompt.label_token_ids))],
        "clipped_sum_norm_per_class": [float(c.norm()) for c in clipped],
        "cos_clipped_vs_no_dp": [_cos(c, p) for c, p in zip(clipped, plain)],
    }
    for epsilon in EPSILONS:
        cos_plain, cos_clipped = [], []
        for _ in range(draws):
            release = draw_release(model, prompt, factors, epsilon=epsilon, delta=DELTA, rows=rows)
            cos_plain.append([_cos(t, p) for t, p in zip(release.targets, plain)])
            cos_clipped.append([_cos(t, c) for t, c in zip(release.targets, clipped)])
        out[f"epsilon_{epsilon:g}"] = {
            "noise_multiplier": release.noise_multiplier,
            "noise_norm_per_class": release.noise_norm(),
            "draws": draws,
            "cos_dp_vs_no_dp_mean": np.mean(cos_plain, axis=0).tolist(),
            "cos_dp_vs_no_dp_min": np.min(cos_plain, axis=0).tolist(),
            "cos_dp_vs_clipped_mean": np.mean(cos_clipped, axis=0).tolist(),
        }
    return out


@torch.no_grad()
def class_signal(model, prompt: Prompt, targets: torch.Tensor, rows, held_out: PrivateFactors) -> dict:
    """AUCs of the per-example matching loss on held-out texts (see module docstring, item 3)."""
    logits = head_logits(model, held_out.hidden)
    losses = np.stack(
        [
            per_example_matching_loss(held_out.hidden, logits, tok, targets[c].to(held_out.hidden.dtype), rows).numpy()
            for c, tok in enumerate(prompt.label_token_ids)
        ],
        axis=1,
    )
    truth = held_out.labels.numpy()
    out = {}
    for c in range(losses.shape[1]):
        own = (truth == c).astype(int)
        other = np.delete(losses, c, axis=1).min(axis=1)
        out[f"class_{c}"] = {
            "auc_low_loss_is_own_class": float(roc_auc_score(own, -losses[:, c])),
            "auc_contrastive": float(roc_auc_score(own, other - losses[:, c])),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("research/synthetic_full_split/release_diagnostics.json"))
    parser.add_argument("--draws", type=int, default=3)
    parser.add_argument(
        "--factors",
        type=Path,
        default=None,
        help="the whole split's factors cached by the rotten_tomatoes_full experiment "
        "(work/private-cache/…/gradmm-factors-*.pt: same model, prompt and max tokens), "
        "instead of a second pass over the data",
    )
    args = parser.parse_args()
    start = time.perf_counter()
    max_tokens = make_config("demo").max_private_tokens
    train = load_dataset("rotten-tomatoes", split="train", seed=0)
    validation = load_dataset("rotten-tomatoes", split="validation", seed=0)
    model, tokenizer = load_model("smollm2-135m", seed=0)
    model.requires_grad_(False)
    prompt = build_prompt(tokenizer, train.verbalizer.template, train.verbalizer.label_words, train.label_names)
    whole = (
        PrivateFactors.load(args.factors)
        if args.factors is not None
        else private_factors(model, tokenizer, list(train.examples), prompt, max_tokens=max_tokens)
    )
    if len(whole.labels) != len(train.examples):
        raise SystemExit(
            f"{args.factors} holds {len(whole.labels)} examples, not the train split's {len(train.examples)}"
        )
    small_pool = [train.examples[i] for i in per_class_indices(train.labels, 50, 0)]
    sets = {
        "pool_50_per_class": private_factors(model, tokenizer, small_pool, prompt, max_tokens=max_tokens),
        "whole_train_split": whole,
    }
    held_out = private_factors(model, tokenizer, list(validation.examples), prompt, max_tokens=max_tokens)
    result: dict = {
        "command": f"OMP_NUM_THREADS=1 python research/synthetic_full_split/release_diagnostics.py --out {args.out}"
        + (f" --factors {args.factors}" if args.factors else ""),
        "setting": {
            "model": "smollm2-135m",
            "dataset": "rotten-tomatoes",
            "data_seed": 0,
            "clip": 1.0,
            "delta": DELTA,
            "max_private_tokens": max_tokens,
            "held_out": "validation split",
            "held_out_size": len(validation.examples),
        },
    }
    for kind in RELEASES:
        rows = released_rows(prompt, kind)
        entry: dict = {
            "released_dim_per_class": (len(rows) if rows else model.get_output_embeddings().weight.shape[0])
            * whole.hidden.shape[1]
        }
        for name, factors in sets.items():
            entry[name] = survival(model, prompt, factors, rows, args.draws)
        targets = {
            "no_dp": factor_class_sums(model, whole, prompt, clip=None, rows=rows),
            "dp_epsilon_1": draw_release(model, prompt, whole, epsilon=1.0, delta=DELTA, rows=rows).targets,
            "noise_only_epsilon_1": draw_release(model, prompt, None, epsilon=1.0, delta=DELTA, rows=rows).targets,
        }
        entry["class_signal_validation_whole_split"] = {
            name: class_signal(model, prompt, t, rows, held_out) for name, t in targets.items()
        }
        result[kind] = entry
        print(kind, json.dumps(entry, indent=1), flush=True)
    result["wall_s"] = round(time.perf_counter() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
