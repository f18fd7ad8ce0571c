"""Generate–select's ``filter`` rule (``selection = "filter"``): the DP release used as a label filter, then a
seeded uniform draw, instead of gradient matching.

GRADMM's label-row release is, per class ``c``, the DP sum ``S_c`` (K × d) of the clipped gradients of the
zero-shot head's label rows ``R0`` (K × d, the LM head's rows of the label tokens; logit_k = R0_k·h) over the
private examples of class ``c``. Their sum ``D = Σ_c S_c`` is one DP gradient of that K-way classifier on the
whole private set. One step from the zero-shot rows along it,

    R(t) = R0 − t·‖R0‖·D/‖D‖,

is a classifier that has learnt from the private data. :func:`filter_select` keeps, per class, the candidates
generated for it that the public few-shot label filter gives it (the pool every selection chooses among) **and**
that ``R(t)`` gives it too, then draws ``n`` of them uniformly with the run's seed
(:func:`~privlm.synthesis.gradmm.filtering.uniform_draw`).

The step length is chosen without private data: among :data:`STEPS`, the one whose head agrees best with the
classes the label-filtered candidates were generated for (balanced over the classes; the shortest on ties). The
candidates and their classes are public, so the choice is post-processing of the release, as is everything here:
the inputs are the release, the public model, the public candidates and the seed. The set costs the release's
(ε, δ) and nothing more.

Why (``research/synthetic_at_scale/pool_reach.md``, Rotten Tomatoes, n = 1,000 per class, ε = 4, three releases,
head-only evaluation with its grid fit): greedy matching chose sets scoring 71.0 ± 0.2, below a uniform draw of
the same pool (74.5 ± 2.0); drawing among the candidates the release's one-step head also gives their class
scored 77.2 ± 0.2 (there the step length was picked on 100 labelled validation sentences; here by the public
rule above).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel

from privlm.errors import UserError
from privlm.synthesis.gradmm.filtering import Candidate, eligible_by_class, uniform_draw
from privlm.synthesis.gradmm.prompt import Prompt, head_weight
from privlm.synthesis.gradmm.release import Release
from privlm.synthesis.gradmm.select import candidate_hidden

# step lengths t, relative to ‖R0‖, searched by the public agreement rule (0 first: the zero-shot rows)
STEPS: tuple[float, ...] = (0.0, *(float(t) for t in torch.logspace(-3, 1, 25, dtype=torch.float64)))


def label_rows_and_direction(model: PreTrainedModel, release: Release) -> tuple[torch.Tensor, torch.Tensor]:
    """The zero-shot label rows ``R0`` (K × d, float64: the LM head's rows of the label tokens) and the release's
    summed targets on those rows, ``D`` (K × d, float64), the DP gradient of the K-way head's loss at ``R0``."""
    tokens = list(release.prompt.label_token_ids)
    start = head_weight(model).detach()[tokens].to(torch.float64)
    summed = release.targets.to(torch.float64).sum(dim=0)  # |R| × d (|R| = V for a full release)
    rows = list(range(summed.shape[0])) if release.rows is None else list(release.rows)
    return start, summed[[rows.index(t) for t in tokens]]


def stepped_rows(start: torch.Tensor, direction: torch.Tensor, t: float) -> torch.Tensor:
    """``R(t) = R0 − t·‖R0‖·D/‖D‖`` (K × d); ``R0`` itself where ``t = 0`` or ``D = 0``."""
    norm = direction.norm()
    if t == 0 or norm == 0:
        return start
    return start - t * start.norm() * direction / norm


def balanced_agreement(logits: torch.Tensor, labels: torch.Tensor, n_classes: int) -> float:
    """The mean over classes of the share of items of each class (``labels``, M) whose argmax of ``logits``
    (M × K) is their class; classes with no item are left out."""
    hits = logits.argmax(dim=1) == labels
    shares = [hits[labels == k].double().mean() for k in range(n_classes) if bool((labels == k).any())]
    return float(torch.stack(shares).mean()) if shares else 0.0


def chosen_step(start: torch.Tensor, direction: torch.Tensor, hidden: torch.Tensor, labels: torch.Tensor) -> float:
    """The step of :data:`STEPS` whose head ``R(t)`` agrees best with ``labels`` on the public features ``hidden``
    (M × d), balanced over the classes; the shortest on ties."""
    n_classes = start.shape[0]
    scores = [balanced_agreement(hidden @ stepped_rows(start, direction, t).T, labels, n_classes) for t in STEPS]
    return STEPS[max(range(len(STEPS)), key=lambda i: (scores[i], -i))]


def eligible_hidden(
    model: PreTrainedModel,
    prompt: Prompt,
    candidates: Sequence[Candidate],
    predicted: Sequence[int],
    public_dir: Path | None = None,
) -> tuple[list[list[Candidate]], list[torch.Tensor]]:
    """Per class, the candidates generated for it that the public label filter (``predicted``) gives it, and
    their final hidden states in the matching layout (M_k × d, float64; kept in ``public_dir`` when given)."""
    pool = eligible_by_class(candidates, predicted, len(prompt.label_token_ids))
    d = head_weight(model).shape[1]
    hidden = [
        candidate_hidden(model, prompt, cands, public_dir=public_dir).to(torch.float64)
        if cands
        else torch.zeros(0, d, dtype=torch.float64)
        for cands in pool
    ]
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
        c for cands, h in zip(pool, hidden) for c, p in zip(cands, (h @ rows.T).argmax(dim=1).tolist()) if p == c.label
    ]
    empty = [k for k in range(len(pool)) if not any(c.label == k for c in agreed)]
    if empty:
        raise UserError(
            f"{head} gives class {prompt.label_names[empty[0]]!r} to none of its {len(pool[empty[0]])} "
            "label-filtered candidates: generate more candidates (--oversample)"
        )
    return uniform_draw(agreed, [c.label for c in agreed], per_class, len(pool), seed)


def filter_select(
    model: PreTrainedModel,
    release: Release,
    candidates: Sequence[Candidate],
    predicted: Sequence[int],
    per_class: int,
    seed: int,
    public_dir: Path | None = None,
) -> tuple[list[Candidate], float]:
    """Per class, ``min(per_class, fewest eligible)`` candidates drawn uniformly (``seed``) among those generated
    for it that the public label filter (``predicted``) and the release's one-step head ``R(t)`` both give it;
    class by class, unscored (``match_loss`` None), and the step ``t`` chosen (module docstring); a class the
    head gives none of its candidates is refused (:func:`head_draw`).
    ``public_dir``: where the candidates' hidden states are kept (public candidates only)."""
    pool, hidden = eligible_hidden(model, release.prompt, candidates, predicted, public_dir)
    start, direction = label_rows_and_direction(model, release)
    labels = torch.tensor([k for k, cands in enumerate(pool) for _ in cands], dtype=torch.long)
    t = chosen_step(start, direction, torch.cat(hidden), labels)
    head = f"the release's one-step head (step {t:g}, the best agreement; or choose with --selection match)"
    return head_draw(stepped_rows(start, direction, t), pool, hidden, per_class, seed, release.prompt, head), t
