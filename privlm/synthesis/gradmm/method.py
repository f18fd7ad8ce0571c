"""The ``gradmm`` experiment method: DP synthetic text from :mod:`privlm.synthesis.gradmm`, one run per cell.

The private pool enters only through GRADMM's DP release (``load_private``); generation and
filtering see the release alone. The run lives in the cell's ``workdir`` and is always resumed:
a saved release is reused, never redrawn, so an interrupted experiment does not spend ε twice.
The pool's last-layer factors are computed once per experiment and kept in ``ctx.private_cache``
(private); each cell's release is then their clipped sum plus its own fresh noise.
Method parameters (TOML ``[methods.gradmm]``): ``preset`` (``paper`` or ``demo``) and any
:class:`privlm.synthesis.gradmm.config.GradmmConfig` field; the cell's seed sets ``seed``. ``noise_only = true``
(e.g. ``[methods."gradmm@noise"]``) is the noise-only control: pure noise at the cell's σ and C, no
private data read, ε spent 0.
Instructed public candidates (``source = "instruct"``) depend on the model, instruction, batch size and
seed only (without an ``instruction``: the dataset's verbalizer's, passed as ``instructions`` by the
experiment runner as to zero-shot generation; for rotten-tomatoes zero-shot's default): cells that share them (DP, noise-only, no-DP, every ε) read them from ``work/public-candidates``.
"""

from __future__ import annotations

import copy
from typing import Any

from privlm.synthesis.gradmm.config import make_config
from privlm.synthesis.gradmm.pipeline import run_gradmm
from privlm.synthesis.gradmm.pool import factor_cache, public_candidates_dir
from privlm.synthesis.gradmm.prompt import build_prompt
from privlm.synthesis.registry import MethodContext


def gradmm_rows(ctx: MethodContext) -> list[dict[str, Any]]:
    """Synthesize ``n_per_class`` examples per class (fewer if filtering runs short) at the cell's ε."""
    params = dict(ctx.params)
    config = make_config(params.pop("preset", "paper"), **params, seed=ctx.seed)
    model = copy.deepcopy(ctx.model).requires_grad_(False)  # GRADMM differentiates the inputs only
    prompt = build_prompt(ctx.tokenizer, ctx.template, ctx.label_words, ctx.label_names)
    ctx.workdir.mkdir(parents=True, exist_ok=True)
    dp = ctx.epsilon is not None
    result = run_gradmm(
        model,
        ctx.tokenizer,
        prompt,
        lambda: list(ctx.pool),
        out=ctx.out,
        per_class=ctx.n_per_class,
        config=config,
        dp=dp,
        epsilon=ctx.epsilon,
        delta=ctx.delta if dp else None,
        resume=True,
        factor_cache=factor_cache(ctx.private_cache, prompt, config),
        public_dir=public_candidates_dir(ctx.workdir.parent, model, config, prompt),
        progress=ctx.progress,
    )
    return [{**row, "epsilon_spent": result.privacy["epsilon"]} for row in result.rows]
