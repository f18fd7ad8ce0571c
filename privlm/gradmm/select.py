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

import torch
from transformers import PreTrainedModel

from privlm.gradmm.filtering import Candidate
from privlm.gradmm.prompt import Prompt, head_logits, last_hidden_from_ids
from privlm.gradmm.release import Release


@torch.no_grad()
def candidate_factors(
    model: PreTrainedModel,
    prompt: Prompt,
    candidates: Sequence[Candidate],
    label: int,
    rows: Sequence[int] | None,
    batch_size: int = 32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Residuals ``(p_j − e_y)_R`` (M × |R|) and hidden states ``h_j`` (M × d), float64, of ``candidates``
    as examples of class ``label`` (``prefix + ids + suffix``, the matching's layout)."""
    label_token = prompt.label_token_ids[label]
    resid, hidden = [], []
    for start in range(0, len(candidates), batch_size):
        chunk = candidates[start : start + batch_size]
        h = last_hidden_from_ids(model, [[*prompt.prefix_ids, *c.ids, *prompt.suffix_ids] for c in chunk])
        r = torch.softmax(head_logits(model, h).to(torch.float64), dim=-1)
        r[:, label_token] -= 1.0
        resid.append(r if rows is None else r[:, list(rows)])
        hidden.append(h.to(torch.float64))
    return torch.cat(resid), torch.cat(hidden)


def greedy_match(gram: torch.Tensor, inner: torch.Tensor, k: int) -> list[int]:
    """Indices of ``k`` items chosen greedily to maximize ``cos_0(S) − max_{r ≥ 1} cos_r(S)`` (just ``cos_0``
    with one target), ``cos_t(S) = Σ_S b_t / √(Σ_{S×S} A_t)``, for ``gram`` A (T × M × M) and ``inner``
    b (T × M) per target t (2-D / 1-D: one target); the first maximum wins ties."""
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


def _match_terms(
    model: PreTrainedModel, release: Release, cands: Sequence[Candidate], label: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gram matrix (M × M) and inner products with the class target (M) of ``cands`` as class ``label``."""
    resid, hidden = candidate_factors(model, release.prompt, cands, label, release.rows)
    target = release.targets[label].to(torch.float64)
    return (resid @ resid.T) * (hidden @ hidden.T), (resid * (hidden @ target.T)).sum(dim=1)


def select_matching(
    model: PreTrainedModel,
    release: Release,
    candidates: Sequence[Candidate],
    predicted: Sequence[int],
    per_class: int,
    contrastive: bool = False,
) -> list[Candidate]:
    """Per class, the ``min(per_class, fewest eligible)`` candidates chosen by :func:`greedy_match`
    against the class target; eligible: generated for the class and (label filter) predicted as it.
    ``contrastive``: maximize the class's cosine minus the best other class's (each set's gradient taken
    with that class's label against that class's target), the class-discriminative part of the release
    (measured on validation texts: AUC 0.75 for the contrastive per-example score, 0.55 for the own-class
    cosine, at ε = 1 on the whole Rotten Tomatoes train split). Output: class by class, in the order chosen."""
    n_classes = len(release.prompt.label_token_ids)
    eligible = [[c for c, p in zip(candidates, predicted, strict=True) if c.label == k == p] for k in range(n_classes)]
    keep = min(per_class, min(len(e) for e in eligible))
    out: list[Candidate] = []
    for k, cands in enumerate(eligible):
        if keep == 0:
            break
        labels = [k, *(r for r in range(n_classes) if r != k)] if contrastive else [k]
        terms = [_match_terms(model, release, cands, label) for label in labels]
        gram, inner = torch.stack([g for g, _ in terms]), torch.stack([b for _, b in terms])
        out.extend(cands[j] for j in greedy_match(gram, inner, keep))
    return out
