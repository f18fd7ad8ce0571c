"""The ``dp-head-pool`` experiment method: a DP labeller chooses among GRADMM's public candidates.

1. The labeller (:mod:`.labeller`): the head-only classifier (the LM head's label-token rows) DP-SGD trained on
   the private pool's last hidden states in GRADMM's matching layout, at the cell's (ε, δ). Its run depends on
   ε, the recipe, the factors' truncation and the cell's seed (each seed is its own draw), not on n: the cells
   that differ only in n share it (one release), kept in ``ctx.private_cache``; the factors are GRADMM's own cache
   file, computed once per experiment.
2. The public pool: the instructed candidates and public label-filter verdicts that a GRADMM cell with the same
   ``preset`` and ``pool_seed`` reads (:func:`~privlm.synthesis.gradmm.method.public_pool`).
3. Per class, ``n`` candidates drawn uniformly (the cell's seed) among those the label filter and the DP labeller
   both give their class (:func:`~privlm.synthesis.gradmm.head_select.head_draw`).

**Guarantee**: the set is post-processing of the labeller's DP-SGD release and public inputs, so it is
(ε, δ)-DP at the run's ε (its sidecar, ``synthetic.privacy.json``, names the run's ledger). Why: the release's
one-step head, used the same way, beat GRADMM's gradient match (``research/synthetic_at_scale/pool_reach.md``); a
labeller trained for many DP-SGD steps is the stronger DP classifier (DP training directly scores 82.3 head-only
at ε = 1 on Rotten Tomatoes, the release's one step 75–76 at ε = 4).
``noise_only = true`` (e.g. ``[methods."dp-head-pool@noise"]``) is its noise-only control: the labeller's run at
the cell's σ on zero hidden states, pure noise that reads no private data but the pool's size, and spends
nothing under the assumption that the pool's size is public, as in every DP-SGD run
(:func:`~privlm.synthesis.dp_head_pool.labeller.noise_labeller`; its rows are drawn once per cell and kept,
public, in the cell's workdir as ``noise-labeller.pt``). It is a degenerate control (a random head: see
``docs/synthesis.md``); ``instruct-pool``, the pool without a labeller, is the informative one.
Parameters (TOML ``[methods.dp-head-pool]``): the GRADMM settings that shape the pool (``preset``, ``pool_seed``,
``batch``, ``oversample``, ``label_filter``, ``instruction``), the labeller's recipe
(:class:`~privlm.synthesis.dp_head_pool.labeller.LabellerConfig` fields) and ``noise_only``.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch
from transformers import PreTrainedModel

from privlm.atomic import atomic_path, write_text_atomic
from privlm.digest import digest
from privlm.errors import UserError
from privlm.progress import shown_steps
from privlm.runfolder import LEDGER, epsilon_statement, sidecar_path
from privlm.synthesis.dp_head_pool.labeller import LabellerConfig, OnProgress, noise_labeller, train_labeller
from privlm.synthesis.gradmm.config import GradmmConfig, make_config
from privlm.synthesis.gradmm.head_select import eligible_hidden, head_draw
from privlm.synthesis.gradmm.pipeline import load_factors
from privlm.synthesis.gradmm.pool import factor_cache, public_pool
from privlm.synthesis.gradmm.prompt import Prompt, build_prompt
from privlm.synthesis.gradmm.release import PrivateFactors
from privlm.synthesis.registry import MethodContext

MECHANISM = (
    "DP-SGD (Poisson sampling, per-sample clipping, Gaussian noise) of the head-only classifier's label-token rows "
    "on the private examples' last hidden states; then a uniform draw among the public instructed candidates that "
    "the public label filter and the trained classifier both give their class (post-processing)"
)
NOISE_MECHANISM = (
    "noise-only control: the labeller's DP-SGD run (same recipe, σ and sampling) on zero hidden states, so every "
    "step's noised gradient is Gaussian noise alone; it read only the pool's size, so it spends no privacy"
)
NOISE_ASSUMPTION = "the pool's size N is public, as in every DP-SGD run (its ledger's sampling rate q = B/N states it)"
NOISE_ROWS = "noise-labeller.pt"  # in the cell's workdir: the noise-only labeller's rows (public: only N was read)
NOISE_SETTINGS = "noise-labeller.json"  # beside them: σ, clip, steps, examples, and the (ε, δ) σ was set for


def dp_head_pool_rows(ctx: MethodContext) -> list[dict[str, Any]]:
    """``n_per_class`` public candidates per class chosen by the DP labeller (module docstring), each row with the
    ε spent; the sidecar beside ``ctx.out`` states the run's privacy."""
    return choose(ctx, ctx.out)[0]


def choose(ctx: MethodContext, out: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows of :func:`dp_head_pool_rows` and the privacy statement written as the sidecar of ``out`` (its
    ``ledger_file`` relative to that sidecar's folder): the experiment's cell set (``ctx.out``) or the file of
    ``privlm synth --method dp-head-pool``. The public candidates are kept in ``ctx.workdir``'s parent, the
    labeller's run in ``ctx.private_cache`` (else ``ctx.workdir``)."""
    if ctx.epsilon is None:
        raise UserError("dp-head-pool is a DP method: give it an ε (its labeller is a DP-SGD run)")
    labeller, params = LabellerConfig.split(ctx.params)
    noise_only = bool(params.pop("noise_only", False))
    config = make_config(params.pop("preset", "instruct"), **params, seed=ctx.seed)
    prompt = build_prompt(ctx.tokenizer, ctx.template, ctx.label_words, ctx.label_names)
    candidates, predicted, public_dir = public_pool(ctx, config, prompt)
    model = copy.deepcopy(ctx.model).requires_grad_(False)
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    training, on_progress = shown_steps(ctx.progress, ctx.epsilon)
    if noise_only:
        head, privacy = _noise_labeller(ctx, ctx.epsilon, model, prompt, labeller, on_progress)
    else:
        head, privacy = _dp_labeller(ctx, ctx.epsilon, model, prompt, config, labeller, on_progress, out)
    training.done()
    pool, hidden = eligible_hidden(model, prompt, candidates, predicted, public_dir, ctx.progress)
    who = "the noise-only labeller" if noise_only else "the DP labeller"
    chosen = head_draw(head, pool, hidden, ctx.n_per_class, ctx.seed, prompt, who)
    privacy = {**privacy, "labeller": labeller.to_dict()}
    write_text_atomic(sidecar_path(out), json.dumps(privacy, indent=2, sort_keys=True) + "\n")
    rows = [
        {
            "text": c.text,
            "label": c.label,
            "label_name": ctx.label_names[c.label],
            "method": "dp-head-pool",
            "epsilon_spent": privacy["epsilon"],
            **({"noise_only": True} if noise_only else {}),
        }
        for c in chosen
    ]
    return rows, privacy


def _noise_labeller(
    ctx: MethodContext,
    epsilon: float,
    model: PreTrainedModel,
    prompt: Prompt,
    labeller: LabellerConfig,
    on_progress: OnProgress | None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The noise-only labeller's rows and the control's statement: drawn once per cell and kept, public, in its
    workdir (``NOISE_ROWS`` and its settings beside it), so a rerun reads the same control, never a new draw."""
    saved, settings_file = ctx.workdir / NOISE_ROWS, ctx.workdir / NOISE_SETTINGS
    if saved.exists() and settings_file.exists():
        rows, settings = torch.load(saved, weights_only=True), json.loads(settings_file.read_text())
    else:
        rows, settings = noise_labeller(
            model, prompt, len(ctx.pool), epsilon=epsilon, delta=ctx.delta, config=labeller, on_progress=on_progress
        )
        settings = {**settings, "epsilon_of_the_noise": epsilon, "delta_of_the_noise": ctx.delta}
        write_text_atomic(settings_file, json.dumps(settings, indent=2, sort_keys=True) + "\n")
        with atomic_path(saved) as tmp:
            torch.save(rows, tmp)
    return rows, {
        "dp": True,
        "noise_only": True,
        "epsilon": 0.0,
        "delta": 0.0,
        "mechanism": NOISE_MECHANISM,
        "assumption": NOISE_ASSUMPTION,
        "noise_labeller": {**settings, "rows_sha256": digest(rows.tolist())},
    }


def _dp_labeller(
    ctx: MethodContext,
    epsilon: float,
    model: PreTrainedModel,
    prompt: Prompt,
    config: GradmmConfig,
    labeller: LabellerConfig,
    on_progress: OnProgress | None,
    out: Path,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The DP labeller's rows at the cell's ``epsilon`` and the privacy statement of its ledger for the sidecar of
    ``out``; its run is shared by the cells that differ only in n, in ``ctx.private_cache``."""
    key = {
        "epsilon": epsilon,
        "delta": ctx.delta,
        "labeller": labeller.to_dict(),
        "max_tokens": config.max_private_tokens,
        "seed": ctx.seed,
    }
    run_dir = (ctx.private_cache or ctx.workdir) / f"dphead-{digest(key)}"

    def read_private() -> PrivateFactors:
        """The private examples' hidden states: one forward pass (shown as a private task, so the steps' time left
        does not include it) or the experiment's cache."""
        return load_factors(
            model,
            ctx.tokenizer,
            prompt,
            lambda: list(ctx.pool),
            config.max_private_tokens,
            factor_cache(ctx.private_cache, prompt, config),
            ctx.progress,
        )

    rows, ledger = train_labeller(
        model,
        prompt,
        read_private,
        epsilon=epsilon,
        delta=ctx.delta,
        config=labeller,
        max_tokens=config.max_private_tokens,
        run_dir=run_dir,
        on_progress=on_progress,
    )
    return rows, {
        **epsilon_statement(ledger, epsilon, ctx.delta, ledger_file=run_dir / LEDGER, sidecar=sidecar_path(out)),
        "private_release": ledger.private_release,
        "mechanism": MECHANISM,
    }
