"""Generate–select: the discrete optimizer that keeps, per class, the public candidates whose *summed*
released-row gradient best matches the DP release (``--optimizer select``).

Candidates are sampled from the public LM (ADMM's seeded starting samples, kept as they are). For
class ``c`` with label token ``y`` and target ``S_c`` (|R| × d), candidate ``j``'s gradient is
``g_j = (p_j − e_y)_R h_jᵀ``. Greedy forward selection adds, ``n`` times, the candidate that maximizes
``cos(S_c, Σ_{j∈chosen} g_j)``, from ``b_j = ⟨S_c, g_j⟩ = r_j·(S_c h_j)`` and the Gram matrix
``A_jk = (r_j·r_k)(h_j·h_k)`` — no |R| × d matrix per candidate is formed. Ties go to the lower
candidate index, so the result is a deterministic function of (release, candidates).

The wall: the inputs are the release, the public model and the public candidates — no private data.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import torch
from transformers import PreTrainedModel

from privlm.atomic import atomic_path
from privlm.digest import digest
from privlm.progress import SILENT, Progress, Task
from privlm.synthesis.gradmm.filtering import CHUNK, Candidate, eligible_by_class
from privlm.synthesis.gradmm.matching import cosine_loss, residuals
from privlm.synthesis.gradmm.prompt import Prompt, head_logits, last_hidden_from_ids
from privlm.synthesis.gradmm.release import Release, head_fingerprint

HIDDEN = "candidate hidden states (public)"  # the progress task of the selection's forward pass over the candidates


@torch.no_grad()
def candidate_hidden(
    model: PreTrainedModel,
    prompt: Prompt,
    candidates: Sequence[Candidate],
    batch_size: int = 32,
    public_dir: Path | None = None,
    task: Task | None = None,
) -> torch.Tensor:
    """Final hidden states (M × d, the model's dtype) of ``candidates`` in the matching's layout (``prefix +
    ids + suffix``), in batches of ``batch_size``; kept in ``public_dir`` when given (public candidates only:
    a function of the public model, prompt and candidate tokens, shared by every release that selects from
    them), in pieces of about :data:`~privlm.synthesis.gradmm.filtering.CHUNK` candidates that start at
    multiples of ``batch_size`` (the states of one pass; a large pool's pass resumes piece by piece).
    ``task`` is advanced by the candidates done (a batch computed or a kept piece read): a public count."""
    shown = task if task is not None else Task()

    def compute(part: Sequence[Candidate]) -> torch.Tensor:
        states = []
        for start in range(0, len(part), batch_size):
            batch = part[start : start + batch_size]
            states.append(
                last_hidden_from_ids(model, [[*prompt.prefix_ids, *c.ids, *prompt.suffix_ids] for c in batch])
            )
            shown.advance(len(batch))
        return torch.cat(states)

    if public_dir is None:
        return compute(candidates)
    fingerprint, piece = head_fingerprint(model), max(1, CHUNK // batch_size) * batch_size
    parts = []
    for first in range(0, len(candidates), piece):
        part = candidates[first : first + piece]
        key = digest(
            {
                "model": fingerprint,
                "prompt": prompt.to_dict(),
                "ids": [list(c.ids) for c in part],
                "batch_size": batch_size,
            }
        )
        path = public_dir / f"hidden-{key}.pt"
        if path.exists():
            parts.append(torch.load(path, weights_only=True))
            shown.advance(len(part))
            continue
        parts.append(compute(part))
        with atomic_path(path) as tmp:
            torch.save(parts[-1], tmp)
    return torch.cat(parts)


@torch.no_grad()
def candidate_factors(
    model: PreTrainedModel,
    prompt: Prompt,
    candidates: Sequence[Candidate],
    labels: Sequence[int],
    rows: Sequence[int] | None,
    batch_size: int = 32,
    public_dir: Path | None = None,
    task: Task | None = None,
) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Per label in ``labels``, residuals ``(p_j − e_y)_R`` (M × |R|), and the hidden states ``h_j``
    (M × d), float64, of ``candidates`` (``prefix + ids + suffix``, the matching's layout): one forward
    pass serves every label (its hidden states kept in ``public_dir`` when given, :func:`candidate_hidden`,
    which advances ``task``)."""
    h_all = candidate_hidden(model, prompt, candidates, batch_size, public_dir, task)
    resid: list[list[torch.Tensor]] = [[] for _ in labels]
    for start in range(0, len(candidates), batch_size):  # the head in the same batches as the forward pass
        logits = head_logits(model, h_all[start : start + batch_size]).to(torch.float64)
        for parts, label in zip(resid, labels):
            parts.append(residuals(logits, prompt.label_token_ids[label], rows))
    return [torch.cat(parts) for parts in resid], h_all.to(torch.float64)


def greedy_match(gram: torch.Tensor, inner: torch.Tensor, k: int) -> list[int]:
    """Indices of ``k`` items chosen greedily to maximize ``cos_0(S) − max_{r ≥ 1} cos_r(S)`` (just ``cos_0``
    with one target), ``cos_t(S) = Σ_S b_t / √(Σ_{S×S} A_t)``, for ``gram`` A (T × M × M) and ``inner``
    b (T × M) per target t (2-D / 1-D: one target); the first maximum wins ties. ``cos_t`` is the cosine of
    the set's summed vector with target t times ‖target t‖ (b holds unnormalized inner products): with
    several targets the score is the difference of cosines weighted by the targets' norms (equal norms: the
    plain difference). Scaling every target by one c > 0 scales every score by c and chooses the same set."""
    gram, inner = (gram[None], inner[None]) if inner.dim() == 1 else (gram, inner)
    chosen: list[int] = []
    dot = torch.zeros(len(inner), 1, dtype=inner.dtype)
    square = torch.zeros(len(inner), 1, dtype=inner.dtype)
    cross = torch.zeros_like(inner)
    diagonal = gram.diagonal(dim1=1, dim2=2)
    available = torch.ones(inner.shape[1], dtype=torch.bool)
    for _ in range(min(k, inner.shape[1])):
        cosines = (dot + inner) / (square + 2 * cross + diagonal).clamp_min(1e-30).sqrt()
        score = cosines[0] - cosines[1:].amax(dim=0) if len(inner) > 1 else cosines[0]
        score[~available] = -torch.inf
        j = int(score.argmax())
        chosen.append(j)
        dot += inner[:, j : j + 1]
        square += 2 * cross[:, j : j + 1] + gram[:, j, j : j + 1]
        cross += gram[:, j]
        available[j] = False
    return chosen


def match_terms(
    model: PreTrainedModel,
    release: Release,
    cands: Sequence[Candidate],
    labels: Sequence[int],
    public_dir: Path | None = None,
    task: Task | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gram matrices (L × M × M) and inner products with each class target (L × M) of ``cands`` taken as
    each class in ``labels`` (``task``: advanced by the candidates' forward pass, :func:`candidate_hidden`)."""
    resids, hidden = candidate_factors(
        model, release.prompt, cands, labels, release.rows, public_dir=public_dir, task=task
    )
    hidden_gram = hidden @ hidden.T
    terms = [
        ((r @ r.T) * hidden_gram, (r * (hidden @ release.targets[label].to(torch.float64).T)).sum(dim=1))
        for r, label in zip(resids, labels)
    ]
    return torch.stack([g for g, _ in terms]), torch.stack([b for _, b in terms])


def select_matching(
    model: PreTrainedModel,
    release: Release,
    candidates: Sequence[Candidate],
    predicted: Sequence[int],
    per_class: int,
    contrastive: bool = False,
    public_dir: Path | None = None,
    progress: Progress = SILENT,
) -> list[Candidate]:
    """Per class, the ``min(per_class, fewest eligible)`` candidates chosen by :func:`greedy_match`
    against the class target; eligible: generated for the class and (label filter) predicted as it.
    ``contrastive``: maximize the class's cosine minus the best other class's (each set's gradient taken
    with that class's label against that class's target; each cosine weighted by its target's norm, see
    :func:`greedy_match` — on the whole Rotten Tomatoes train split the classes' clipped sums differ in
    norm by 1.7 %, measured without noise),
    the class-discriminative part of the release
    (measured on validation texts: AUC 0.75 for the contrastive per-example score, 0.55 for the own-class
    cosine, at ε = 1 on the whole Rotten Tomatoes train split). Output: class by class, in the order chosen,
    each with its own matching loss ``1 − cos(S_k, g_j)`` (the candidates arrive unscored).
    ``public_dir``: where the candidates' hidden states are kept (public candidates only); their forward pass is
    shown on ``progress`` as :data:`HIDDEN`."""
    n_classes = len(release.prompt.label_token_ids)
    eligible = eligible_by_class(candidates, predicted, n_classes)
    keep = min(per_class, min(len(e) for e in eligible))
    if keep == 0:
        return []
    shown = progress.task(HIDDEN, total=sum(len(e) for e in eligible))
    out: list[Candidate] = []
    for k, cands in enumerate(eligible):
        labels = [k, *(r for r in range(n_classes) if r != k)] if contrastive else [k]
        gram, inner = match_terms(model, release, cands, labels, public_dir, shown)
        target = release.targets[k].to(torch.float64)
        for j in greedy_match(gram, inner, keep):  # its own matching loss: ⟨S_k, g_j⟩ = b_j, ‖g_j‖² = A_jj
            out.append(replace(cands[j], match_loss=float(cosine_loss(inner[0, j], gram[0, j, j], target))))
    shown.done()
    return out
