"""The ``dp-finetune-gen`` experiment method: DP fine-tune, then generate (:mod:`privlm.synthesis.dp_finetune`).

The training run depends on the cell's ε and seed and the method's parameters, not on n, so the cells
that differ only in n share one run, kept in ``ctx.private_cache`` (its checkpoints hold noise keys while it
trains: private), beside the private rows' prefix cache that every run on the pool shares; each cell
samples its own n per class from it. Published together, those cells are one release (one ε), not several;
a cell whose shared run another process holds waits for it. At ε 'none' the run takes the same steps with
σ = 0 (per-example clipping, no noise): NOT private, a reference. Parameters (TOML
``[methods.dp-finetune-gen]``): any
:class:`privlm.synthesis.dp_finetune.DPFinetuneConfig` field but ``seed`` (the cell's seed).
"""

from __future__ import annotations

from typing import Any

from privlm.digest import digest
from privlm.progress import shown_steps
from privlm.synthesis.dp_finetune.config import DPFinetuneConfig
from privlm.synthesis.dp_finetune.mechanism import run_dp_finetune
from privlm.synthesis.registry import MethodContext


def dp_finetune_rows(ctx: MethodContext) -> list[dict[str, Any]]:
    """``n_per_class`` texts per class sampled from the model DP fine-tuned on the pool at the cell's ε; at ε
    'none' the same run with σ = 0 (clipping without noise: NOT private, the reference for what the noise
    costs)."""
    config = DPFinetuneConfig(**{**ctx.params, "seed": ctx.seed})
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    shared = ctx.private_cache or ctx.workdir
    training, on_progress = shown_steps(ctx.progress, ctx.epsilon)
    run_dir = shared / ("dpft-" + digest({"epsilon": ctx.epsilon, "delta": ctx.delta, "config": config.to_dict()}))
    result = run_dp_finetune(
        ctx.model,
        ctx.tokenizer,
        ctx.label_names,
        lambda: list(ctx.pool),
        out=ctx.out,
        per_class=ctx.n_per_class,
        config=config,
        epsilon=ctx.epsilon,
        delta=ctx.delta,
        run_dir=run_dir,
        wait=True,  # a cell sharing the run that another process is training waits for it, then reuses it
        on_progress=on_progress,
        progress=ctx.progress,
        shared_prefix=ctx.private_cache,  # one prefix cache for every ε, seed and σ on this pool
    )
    training.done()
    if ctx.epsilon is None:
        return result.rows
    return [{**row, "epsilon_spent": result.privacy["epsilon"]} for row in result.rows]
