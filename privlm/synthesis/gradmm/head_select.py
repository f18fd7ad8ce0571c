"""Choosing among label-filtered public candidates with a K-way head on their hidden states (logit_k = R_k·h, the
LM head's label-token rows replaced by ``R``): keep the candidates it gives their own class, draw uniformly.
Shared by generate–select's ``filter`` rule (the release's one-step head,
:mod:`~privlm.synthesis.gradmm.release_filter`) and ``dp-head-pool`` (a DP-SGD-trained head). Post-processing: the
inputs are a head (a DP release or public), the public model and the public candidates."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel

from privlm.errors import UserError
from privlm.progress import SILENT, Progress
from privlm.synthesis.gradmm.filtering import Candidate, eligible_by_class, uniform_draw
from privlm.synthesis.gradmm.prompt import Prompt, head_weight
from privlm.synthesis.gradmm.select import HIDDEN, candidate_hidden


def eligible_hidden(
    model: PreTrainedModel,
    prompt: Prompt,
    candidates: Sequence[Candidate],
    predicted: Sequence[int],
    public_dir: Path | None = None,
    progress: Progress = SILENT,
) -> tuple[list[list[Candidate]], list[torch.Tensor]]:
    """Per class, the candidates generated for it that the public label filter (``predicted``) gives it, and
    their final hidden states in the matching layout (M_k × d, float64; kept in ``public_dir`` when given;
    their forward pass shown on ``progress`` as :data:`~privlm.synthesis.gradmm.select.HIDDEN`)."""
    pool = eligible_by_class(candidates, predicted, len(prompt.label_token_ids))
    d = head_weight(model).shape[1]
    shown = progress.task(HIDDEN, total=sum(len(cands) for cands in pool))
    hidden = [
        candidate_hidden(model, prompt, cands, public_dir=public_dir, task=shown).to(torch.float64)
        if cands
        else torch.zeros(0, d, dtype=torch.float64)
        for cands in pool
    ]
    shown.done()
    return pool, hidden


def head_draw(
    rows: torch.Tensor,
    pool: Sequence[Sequence[Candidate]],
    hidden: Sequence[torch.Tensor],
    per_class: int,
    seed: int,
    prompt: Prompt,
    head: str,
) -> list[Candidate]:
    """Per class, ``min(per_class, fewest agreed)`` of the candidates of ``pool`` (per class, with their ``hidden``
    states) that the head ``rows`` (K × d: logit_k = R_k·h) gives their class, drawn uniformly (``seed``); class
    by class. A class the head gives none of its candidates is a :class:`UserError` naming ``head`` (an empty set
    helps no one)."""
    agreed = [
        c
        for cands, h in zip(pool, hidden, strict=True)
        for c, p in zip(cands, (h @ rows.T).argmax(dim=1).tolist(), strict=True)
        if p == c.label
    ]
    for k, cands in enumerate(pool):
        if not cands:
            raise UserError(
                f"the public label filter keeps no candidate of class {prompt.label_names[k]!r}: generate more "
                "candidates (the oversample setting)"
            )
        if not any(c.label == k for c in agreed):
            raise UserError(
                f"{head} gives class {prompt.label_names[k]!r} to none of its {len(cands)} label-filtered "
                "candidates: generate more candidates (the oversample setting)"
            )
    return uniform_draw(agreed, [c.label for c in agreed], per_class, len(pool), seed)
