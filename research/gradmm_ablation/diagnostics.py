"""Why GRADMM's text barely depends on the gradient matching at CPU scale (a follow-up to the GRADMM ablations).

    python research/gradmm_ablation/diagnostics.py --out research/gradmm_ablation/diagnostics.json

Same pool (50 per class, data seed 0), model (SmolLM2-135M) and demo GRADMM settings as
``research/synthetic_pool50/config.toml``; the target is the no-DP release (the best case for matching).
Three measurements, written to JSON:

1. **Target structure** — the share of ``‖S_c‖²`` in the label-token rows of the LM-head gradient, and
   ``cos(S_0, S_1)``: how much of the target is "the mean last hidden state, in the label row".
2. **Class signal of the objective** — on held-out real texts (not in the pool, so not in the release),
   the per-example loss ``1 − cos(S_c, g(text, label c))``: its mean on texts of class c and of the
   other class, the AUC with which a low loss picks out class c, and the AUC of the contrastive score
   ``loss_other − loss_own``.
3. **What survives DP** — releases drawn at ε = 1 and ε = 0.05 (δ = 1e-5, C = 1, as in the grid): the
   cosine of each class target with the no-DP target, and the public noise norm ``σ·C·√(V·d)``.
4. **ADMM trace** — one demo batch (class 0, seed 0, 12 tokens, top-k 10) optimised with Adam at
   ρ = 0.7 (the preset) and ρ = 0 (no coupling): matching-gradient and penalty-gradient norms, how far
   the embeddings move, and the matching loss of the start, of the continuous iterate and of its projection.

This is analysis, not a release: it reads the private pool without noise and prints statistics of it,
exactly like the grid's no-DP cells, and nothing it computes feeds any other run.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.metrics import roc_auc_score

from privlm.experiments.sampling import per_class_indices
from privlm.resources.datasets import load_dataset
from privlm.resources.models import load_model
from privlm.synthesis.gradmm.config import make_config
from privlm.synthesis.gradmm.generate import batch_seed, make_objective, projection_context
from privlm.synthesis.gradmm.matching import per_example_matching_loss
from privlm.synthesis.gradmm.projection import Projector
from privlm.synthesis.gradmm.prompt import build_prompt, encode_text, head_logits, last_hidden_from_ids
from privlm.synthesis.gradmm.release import draw_release, private_factors


def target_structure(targets: torch.Tensor, label_tokens: tuple[int, ...]) -> dict:
    """Share of each class target's squared norm in the label-token rows, and the classes' cosine."""
    flat = targets.flatten(1)
    return {
        "label_row_energy_share": [float(t[list(label_tokens)].norm() ** 2 / t.norm() ** 2) for t in targets],
        "cos_between_class_targets": float(F.cosine_similarity(flat[0], flat[1], dim=0)),
    }


def _row_losses(
    hidden: torch.Tensor, probs: torch.Tensor, label_token: int, target: torch.Tensor, rows: torch.Tensor
) -> np.ndarray:
    """Per-example ``1 − cos`` restricted to the vocabulary rows ``rows`` (bool, V) of the LM-head gradient."""
    resid = probs.clone()
    resid[:, label_token] -= 1.0
    resid, target = resid[:, rows], target[rows]
    inner = (resid * (hidden @ target.T)).sum(dim=1)
    return (1.0 - inner / (resid.norm(dim=1) * hidden.norm(dim=1) * target.norm())).numpy()


@torch.no_grad()
def class_signal(
    model, tokenizer, prompt, targets: torch.Tensor, texts: list[tuple[str, int]], max_tokens: int
) -> dict:
    """Per-example matching losses of real held-out texts against each class target (see module docstring),
    over all vocabulary rows (GRADMM's objective), the label-token rows only, and the other rows only."""
    hidden = torch.cat(
        [last_hidden_from_ids(model, [encode_text(tokenizer, prompt, t, max_tokens)]) for t, _ in texts]
    ).float()
    probs = torch.softmax(head_logits(model, hidden).float(), dim=-1)
    targets = targets.float()
    labels = torch.zeros(targets.shape[1], dtype=torch.bool)
    labels[list(prompt.label_token_ids)] = True
    truth = np.array([k for _, k in texts])
    out: dict = {}
    for name, rows in (("all_rows", torch.ones_like(labels)), ("label_rows", labels), ("other_rows", ~labels)):
        losses = np.stack(
            [_row_losses(hidden, probs, tok, targets[c], rows) for c, tok in enumerate(prompt.label_token_ids)], 1
        )
        if name == "all_rows":  # the library's objective, computed independently
            lib = per_example_matching_loss(
                hidden, head_logits(model, hidden).float(), prompt.label_token_ids[0], targets[0]
            )
            assert np.allclose(lib.numpy(), losses[:, 0], atol=1e-4)
        for c in range(losses.shape[1]):
            own = (truth == c).astype(int)
            other = np.delete(losses, c, axis=1).min(axis=1)
            out.setdefault(name, {})[f"class_{c}"] = {
                "mean_loss_own_class": float(losses[own == 1, c].mean()),
                "mean_loss_other_class": float(losses[own == 0, c].mean()),
                "auc_low_loss_is_own_class": float(roc_auc_score(own, -losses[:, c])),
                "auc_contrastive": float(roc_auc_score(own, other - losses[:, c])),
            }
    return out


def dp_targets(model, tokenizer, pool, prompt, clean: torch.Tensor, max_tokens: int) -> dict:
    """Per ε: σ, the expected noise norm per class, and ``cos(DP target, no-DP target)`` per class."""
    out = {}
    for epsilon in (1.0, 0.05):
        factors = private_factors(model, tokenizer, pool, prompt, max_tokens=max_tokens)
        release = draw_release(model, prompt, factors, epsilon=epsilon, delta=1e-5, max_tokens=max_tokens)
        out[str(epsilon)] = {
            "noise_multiplier": release.noise_multiplier,
            "noise_norm_per_class": release.noise_norm(),
            "cos_with_no_dp_target": [
                float(F.cosine_similarity(release.targets[c].flatten().float(), clean[c].flatten().float(), dim=0))
                for c in range(len(clean))
            ],
        }
    return out


def admm_trace(objective, projector: Projector, start: torch.Tensor, rho: float, lr: float, steps: int) -> dict:
    """Adam on ``match + ρ/2‖x − z‖²`` from the start's embeddings (z = the start, one outer step)."""
    x0 = projector.embed(start)
    x = x0.clone().requires_grad_(True)
    opt = torch.optim.Adam([x], lr=lr)
    trace = []
    for step in range(steps):
        opt.zero_grad(set_to_none=True)
        match = objective(x)
        (grad_match,) = torch.autograd.grad(match, x, retain_graph=True)
        (match + 0.5 * rho * (x - x0).pow(2).sum()).backward()
        trace.append(
            {
                "step": step,
                "match": match.item(),
                "grad_match_norm": grad_match.norm().item(),
                "grad_penalty_norm": (rho * (x - x0)).norm().item(),
                "rms_move": (x - x0).pow(2).mean().sqrt().item(),
            }
        )
        opt.step()
    ids = projector(x.detach())
    with torch.no_grad():
        return {
            "rho": rho,
            "lr": lr,
            "steps": steps,
            "trace": trace,
            "match_start": objective(x0).item(),
            "match_continuous": objective(x.detach()).item(),
            "match_projected": objective(projector.embed(ids)).item(),
            "tokens_changed_by_projection": float((ids != start).float().mean()),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=Path("research/gradmm_ablation/diagnostics.json"))
    args = parser.parse_args()
    torch.manual_seed(0)
    config = make_config("demo")
    train = load_dataset("rotten-tomatoes", split="train", seed=0)
    pool_idx = per_class_indices(train.labels, 50, 0)
    pool = [train.examples[i] for i in pool_idx]
    held_out = [train.examples[i] for i in per_class_indices(train.labels, 50, 1, exclude=pool_idx)]
    model, tokenizer = load_model("smollm2-135m", seed=0)
    model.requires_grad_(False)
    prompt = build_prompt(tokenizer, train.verbalizer.template, train.verbalizer.label_words, train.label_names)
    release = draw_release(  # all rows: the measurements below are about the full (paper's) release
        model,
        prompt,
        private_factors(model, tokenizer, pool, prompt, max_tokens=config.max_private_tokens),
        epsilon=None,
        delta=None,
        dp=False,
        max_tokens=config.max_private_tokens,
    )
    targets = release.targets
    projector = Projector(model, tokenizer, projection_context(tokenizer, prompt), config.top_k)
    objective = make_objective(model, prompt, prompt.label_token_ids[0], targets[0].to(projector.embedding.dtype))
    start = projector.sample(config.batch, config.length, torch.Generator().manual_seed(batch_seed(0, 0, 0)))
    steps = config.outer_steps * config.inner_steps
    result = {
        "command": "python research/gradmm_ablation/diagnostics.py --out " + str(args.out),
        "setting": {
            "model": "smollm2-135m",
            "dataset": "rotten-tomatoes",
            "pool_per_class": 50,
            "held_out_per_class": 50,
            "gradmm": config.to_dict(),
        },
        "target_structure": target_structure(targets, prompt.label_token_ids),
        "class_signal_held_out": class_signal(model, tokenizer, prompt, targets, held_out, config.max_private_tokens),
        "dp_targets": dp_targets(model, tokenizer, pool, prompt, targets, config.max_private_tokens),
        "admm": [admm_trace(objective, projector, start, rho, config.lr, steps) for rho in (config.rho, 0.0)],
        "start_texts": [tokenizer.decode(s).strip() for s in start[:3]],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "admm"}, indent=2))
    for run in result["admm"]:
        print({k: v for k, v in run.items() if k != "trace"})


if __name__ == "__main__":
    main()
