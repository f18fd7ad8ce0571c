"""Generate–select's ``filter`` rule (``selection = "filter"``): the DP release used as a label filter, then a
seeded uniform draw, instead of gradient matching.

GRADMM's label-row release is, per class ``c``, the DP sum ``S_c`` (K × d) over the private examples of class
``c`` of the clipped gradients of the language-model loss of the label word (softmax over the whole vocabulary,
``(p − e_y) hᵀ``), restricted to the label tokens' rows ``R0`` of the LM head (K × d; logit_k = R0_k·h is the
zero-shot K-way classifier). Their sum ``D = Σ_c S_c`` is one DP gradient, on the whole private set, of that
loss with respect to the classifier's rows (close to, not equal to, the K-way loss's gradient: the other
tokens' probabilities enter ``p``). One step from the zero-shot rows along it,

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
rule above, which favours the steps whose head drops the fewest candidates of their own class: on Rotten Tomatoes
at ε = 1 it chose t = 0.46, where validation had chosen 1.0–1.47 at ε = 4).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel

from privlm.progress import SILENT, Progress
from privlm.synthesis.gradmm.filtering import Candidate
from privlm.synthesis.gradmm.head_select import eligible_hidden, head_draw
from privlm.synthesis.gradmm.release import Release
from privlm.training.head import label_word_rows

# step lengths t, relative to ‖R0‖, searched by the public agreement rule (0 first: the zero-shot rows)
STEPS: tuple[float, ...] = (0.0, *(float(t) for t in torch.logspace(-3, 1, 25, dtype=torch.float64)))


def label_rows_and_direction(model: PreTrainedModel, release: Release) -> tuple[torch.Tensor, torch.Tensor]:
    """The zero-shot label rows ``R0`` (K × d, float64: the LM head's rows of the label tokens,
    :func:`~privlm.training.head.label_word_rows`, which refuses an output layer with a bias) and the release's
    summed targets on those rows, ``D`` (K × d, float64): the DP gradient of the label word's LM loss with respect
    to those rows at ``R0`` (module docstring). Only the label rows are read and widened (a full release holds V of them)."""
    tokens = list(release.prompt.label_token_ids)
    start = label_word_rows(model, tokens).to(torch.float64)
    released = list(range(release.targets.shape[1])) if release.rows is None else list(release.rows)
    picked = release.targets[:, [released.index(t) for t in tokens]]  # K × K × d: the label rows only
    return start, picked.to(torch.float64).sum(dim=0)


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


def filter_select(
    model: PreTrainedModel,
    release: Release,
    candidates: Sequence[Candidate],
    predicted: Sequence[int],
    per_class: int,
    seed: int,
    public_dir: Path | None = None,
    progress: Progress = SILENT,
) -> tuple[list[Candidate], float]:
    """Per class, ``min(per_class, fewest eligible)`` candidates drawn uniformly (``seed``) among those generated
    for it that the public label filter (``predicted``) and the release's one-step head ``R(t)`` both give it;
    class by class, unscored (``match_loss`` None), and the step ``t`` chosen (module docstring); a class the
    head gives none of its candidates is refused (:func:`head_draw`).
    ``public_dir``: where the candidates' hidden states are kept (public candidates only); their forward pass is
    shown on ``progress`` (:func:`eligible_hidden`)."""
    pool, hidden = eligible_hidden(model, release.prompt, candidates, predicted, public_dir, progress)
    start, direction = label_rows_and_direction(model, release)
    labels = torch.tensor([k for k, cands in enumerate(pool) for _ in cands], dtype=torch.long)
    t = chosen_step(start, direction, torch.cat(hidden), labels)
    head = f"the release's one-step head (step {t:g}, the best agreement; or choose with --selection match)"
    return head_draw(stepped_rows(start, direction, t), pool, hidden, per_class, seed, release.prompt, head), t
