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
    """Indices of ``k`` items chosen greedily to maximize ``Σ_S b / √(Σ_{S×S} A)`` (``gram`` A: M × M,
    ``inner`` b: M); the first maximum wins ties."""
    chosen: list[int] = []
    dot, square = 0.0, 0.0
    cross = torch.zeros_like(inner)
    available = torch.ones_like(inner, dtype=torch.bool)
    for _ in range(min(k, len(inner))):
        score = (dot + inner) / (square + 2 * cross + gram.diagonal()).clamp_min(1e-30).sqrt()
        score[~available] = -torch.inf
        j = int(score.argmax())
        chosen.append(j)
        dot += float(inner[j])
        square += float(2 * cross[j] + gram[j, j])
        cross += gram[j]
        available[j] = False
    return chosen


def select_matching(
    model: PreTrainedModel,
    release: Release,
    candidates: Sequence[Candidate],
    predicted: Sequence[int],
    per_class: int,
) -> list[Candidate]:
    """Per class, the ``min(per_class, fewest eligible)`` candidates chosen by :func:`greedy_match`
    against the class target; eligible: generated for the class and (label filter) predicted as it.
    Output: class by class, in the order chosen."""
    n_classes = len(release.prompt.label_token_ids)
    eligible = [[c for c, p in zip(candidates, predicted, strict=True) if c.label == k == p] for k in range(n_classes)]
    keep = min(per_class, min(len(e) for e in eligible))
    out: list[Candidate] = []
    for k, cands in enumerate(eligible):
        if keep == 0:
            break
        resid, hidden = candidate_factors(model, release.prompt, cands, k, release.rows)
        target = release.targets[k].to(torch.float64)
        inner = (resid * (hidden @ target.T)).sum(dim=1)
        gram = (resid @ resid.T) * (hidden @ hidden.T)
        out.extend(cands[j] for j in greedy_match(gram, inner, keep))
    return out

