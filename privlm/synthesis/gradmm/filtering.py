"""Post-hoc filtering of synthetic candidates, from public inputs and the DP release only.

1. Label agreement: the public model, prompted with fixed few-shot demonstrations that we wrote
   (:data:`PUBLIC_FEW_SHOT`, never drawn from private data), predicts each candidate's label; candidates
   whose prediction differs from their intended class are dropped. Predictions are contextually
   calibrated (Zhao et al., 2021): the label log-probabilities of the content-free input ``"N/A"`` are
   subtracted, so a model biased towards one label word does not wipe out the other classes.
2. Ranking: the survivors of each class are ordered by their own matching loss against the DP release
   (``1 − cos(S_c, g_j)``, computed earlier from the release only).
3. Keep ``n`` per class and rebalance: every class keeps the same number, ``min(n, fewest survivors)``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.lm.shared_prefix import SharedPrefix
from privlm.synthesis.gradmm.prompt import Prompt, head_logits

# Written for privlm (public): demonstrations per label word.
PUBLIC_FEW_SHOT: dict[str, tuple[str, ...]] = {
    "great": (
        "a warm, funny and moving film with a wonderful cast",
        "one of the smartest and most beautiful pictures of the year",
    ),
    "bad": (
        "a dull, clumsy mess that goes on far too long",
        "the plot makes no sense and the acting is wooden",
    ),
    "joy": ("what a happy day, i love everyone here",),
    "sadness": ("i feel so alone and tired of everything",),
}


CONTENT_FREE = "N/A"


# public candidates per cached piece of a pass over a pool (labels, hidden states): a multiple of the
# passes' batch sizes (16 and 32), so pieces cut no batch
CHUNK = 512


@dataclass(frozen=True)
class Candidate:
    """One synthetic example: its tokens, text, intended class and matching loss vs the DP release
    (``None`` until scored: generate–select scores only the candidates it keeps)."""

    ids: tuple[int, ...]
    text: str
    label: int
    match_loss: float | None


def few_shot_context(prompt: Prompt, only: int | None = None) -> str:
    """The demonstrations, interleaved by class; empty (zero-shot) unless every label word has some.
    ``only=k``: the demonstrations of class k alone (under the same condition)."""
    shots = [PUBLIC_FEW_SHOT.get(word.strip().lower(), ()) for word in prompt.label_words]
    if not all(shots):
        return ""
    if only is not None:
        shots = [s if k == only else () for k, s in enumerate(shots)]
    lines = []
    for round_ in range(max(len(s) for s in shots)):
        for k, examples in enumerate(shots):
            if round_ < len(examples):
                lines.append(prompt.completion(examples[round_], k) + "\n")
    return "".join(lines)


@torch.no_grad()
def few_shot_scores(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: Prompt,
    texts: Sequence[str],
    batch_size: int = 16,
) -> torch.Tensor:
    """The calibrated label log-probabilities of each text, ``(len(texts), classes)`` float32: the
    log-softmax over the label tokens after ``context + text + suffix`` minus that after
    ``context + "N/A" + suffix``. The shared ``context`` (document start, demonstrations, the template's
    lead) is run once (:class:`~privlm.lm.shared_prefix.SharedPrefix`); each text runs on its keys and
    values, so a pass costs the texts' tokens, not the demonstrations' once per text."""
    context = tokenizer.encode(few_shot_context(prompt), add_special_tokens=False)
    shared = SharedPrefix(model, prompt.with_context(context))
    label_tokens = torch.tensor(prompt.label_token_ids)

    def label_logprobs(batch: Sequence[str]) -> torch.Tensor:
        seqs = [[*prompt.text_ids(tokenizer, t), *prompt.suffix_ids] for t in batch]
        logits = head_logits(model, shared.last_hidden(seqs))
        return torch.log_softmax(logits[:, label_tokens].to(torch.float32), dim=1)

    content_free = label_logprobs([CONTENT_FREE])[0]
    parts = [label_logprobs(texts[start : start + batch_size]) for start in range(0, len(texts), batch_size)]
    return torch.cat(parts) - content_free if parts else torch.empty(0, len(label_tokens))


def few_shot_labels(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    prompt: Prompt,
    texts: Sequence[str],
    batch_size: int = 16,
) -> list[int]:
    """Predicted class per text: the argmax of its :func:`few_shot_scores`."""
    return few_shot_scores(model, tokenizer, prompt, texts, batch_size).argmax(dim=1).tolist()


def eligible_by_class(
    candidates: Sequence[Candidate], predicted: Sequence[int], n_classes: int
) -> list[list[Candidate]]:
    """Per class, in candidate order, the candidates generated for it that the label filter (``predicted``, one
    class per candidate) also gives it: what every selection from a pool chooses among."""
    return [[c for c, p in zip(candidates, predicted, strict=True) if c.label == k == p] for k in range(n_classes)]


def uniform_draw(
    candidates: Sequence[Candidate], predicted: Sequence[int], per_class: int, n_classes: int, seed: int
) -> list[Candidate]:
    """Per class, ``min(per_class, fewest eligible)`` of the candidates generated for it and given it by the
    label filter (``predicted``), in a uniformly random order seeded by ``seed`` (so a prefix of a class is a
    smaller draw); class by class. A public, reproducible draw (``torch.Generator``): no privacy claim rests on it."""
    eligible = eligible_by_class(candidates, predicted, n_classes)
    keep = min(per_class, min(len(e) for e in eligible))
    generator = torch.Generator().manual_seed(seed)
    return [e[int(i)] for e in eligible for i in torch.randperm(len(e), generator=generator)[:keep]]


def select(
    candidates: Sequence[Candidate], predicted: Sequence[int], per_class: int, n_classes: int
) -> list[Candidate]:
    """Drop label disagreements, keep the lowest-loss ``min(per_class, fewest survivors)`` per class.

    Output order: class by class, lowest matching loss first (ties by text, so it is deterministic).
    """
    by_class = eligible_by_class(candidates, predicted, n_classes)
    keep = min(per_class, min(len(c) for c in by_class))
    out: list[Candidate] = []
    for cands in by_class:
        out.extend(sorted(cands, key=lambda c: (c.match_loss, c.text))[:keep])
    return out
