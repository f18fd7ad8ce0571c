"""The ``instruct-pool`` method: n texts per class drawn uniformly, with the cell's seed, from the public
candidates GRADMM's generate–select chooses among (``source = "instruct"``): the public LM's answers to each
class's instruction, kept where the public few-shot label filter gives them their class.

Reads no private data (ε = 0): the candidates, the label filter and the draw depend on the public model, the
public instructions and public seeds only. It is the baseline a selection by the DP release must beat: a
GRADMM cell and an ``instruct-pool`` cell with the same ``preset`` and ``pool_seed`` in one experiment read the
same candidates and label verdicts from ``work/public-candidates`` (made once, by whichever cell comes first).
Parameters (TOML ``[methods.instruct-pool]``): ``preset`` (default ``instruct``) and the GRADMM settings that
shape the pool (``pool_seed``, ``batch``, ``oversample``, ``label_filter``, ``instruction``); the cell's seed
draws the subset.
"""

from __future__ import annotations

from typing import Any

from privlm.errors import UserError
from privlm.synthesis.gradmm.config import make_config
from privlm.synthesis.gradmm.filtering import Candidate, uniform_draw
from privlm.synthesis.gradmm.generate import batch_seed, candidate_jobs, instructed_batch, public_labels, unscored
from privlm.synthesis.gradmm.method import public_candidates_dir
from privlm.synthesis.gradmm.prompt import build_prompt
from privlm.synthesis.registry import MethodContext


def instruct_pool_rows(ctx: MethodContext) -> list[dict[str, Any]]:
    """``n_per_class`` texts per class (fewer where the label filter keeps fewer) drawn from the public pool."""
    params = dict(ctx.params)
    config = make_config(params.pop("preset", "instruct"), **params, seed=ctx.seed)
    if config.source != "instruct":
        raise UserError(
            f"instruct-pool draws instructed candidates: its preset must use source 'instruct' (got {config.source!r})"
        )
    prompt = build_prompt(ctx.tokenizer, ctx.template, ctx.label_words, ctx.label_names)
    public_dir = public_candidates_dir(ctx.workdir.parent, ctx.model, config, prompt)
    public_dir.mkdir(parents=True, exist_ok=True)
    n_classes = len(ctx.label_names)
    jobs = candidate_jobs(ctx.n_per_class, config, n_classes)
    task = ctx.progress.task("public candidates (instructed answers)", total=len(jobs))
    candidates: list[Candidate] = []
    for k, j in jobs:  # GRADMM's order, so the label filter's kept pieces are the same
        ids = instructed_batch(
            ctx.model, ctx.tokenizer, prompt, k, config, batch_seed(config.candidate_seed, k, j), public_dir
        )
        candidates += unscored(ctx.tokenizer, ids, k)
        task.advance()
    task.done()
    predicted = (
        public_labels(ctx.model, ctx.tokenizer, prompt, candidates, public_dir)
        if config.label_filter
        else [c.label for c in candidates]
    )
    return [
        {
            "text": c.text,
            "label": c.label,
            "label_name": ctx.label_names[c.label],
            "method": "instruct-pool",
            "uses_private_data": False,
        }
        for c in uniform_draw(candidates, predicted, ctx.n_per_class, n_classes, ctx.seed)
    ]
