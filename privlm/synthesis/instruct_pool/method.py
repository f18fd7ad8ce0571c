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

from privlm.synthesis.gradmm.config import make_config
from privlm.synthesis.gradmm.filtering import uniform_draw
from privlm.synthesis.gradmm.pool import public_pool
from privlm.synthesis.gradmm.prompt import build_prompt
from privlm.synthesis.registry import MethodContext


def instruct_pool_rows(ctx: MethodContext) -> list[dict[str, Any]]:
    """``n_per_class`` texts per class (fewer where the label filter keeps fewer) drawn from the public pool."""
    params = dict(ctx.params)
    config = make_config(params.pop("preset", "instruct"), **params, seed=ctx.seed)
    prompt = build_prompt(ctx.tokenizer, ctx.template, ctx.label_words, ctx.label_names)
    candidates, predicted, _ = public_pool(ctx, config, prompt)
    return [
        {
            "text": c.text,
            "label": c.label,
            "label_name": ctx.label_names[c.label],
            "method": "instruct-pool",
            "uses_private_data": False,
        }
        for c in uniform_draw(candidates, predicted, ctx.n_per_class, len(ctx.label_names), ctx.seed)
    ]
