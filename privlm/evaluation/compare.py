"""Synthetic set vs a random real subset of the same size: the check that ends ``make demo``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import numpy as np
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.evaluation.evaluate import fit_and_score
from privlm.evaluation.finetune_config import FinetuneConfig
from privlm.evaluation.scoring import Example


def matched_random_subset(real: Sequence[Example], counts: dict[int, int], seed: int) -> list[Example]:
    """``counts[c]`` examples of each class ``c`` drawn uniformly from ``real`` (``default_rng(seed)``)."""
    rng = np.random.default_rng(seed)
    chosen: list[Example] = []
    for label in sorted(counts):
        members = [e for e in real if e[1] == label]
        if len(members) < counts[label]:
            raise UserError(f"class {label} has {len(members)} real examples, fewer than the {counts[label]} needed")
        chosen.extend(members[i] for i in rng.choice(len(members), size=counts[label], replace=False))
    return chosen


def synthetic_vs_random(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    synthetic: Sequence[Example],
    real: Sequence[Example],
    test: Sequence[Example],
    template: str,
    label_words: Sequence[str],
    config: FinetuneConfig,
    seed: int = 0,
) -> dict[str, dict[str, object]]:
    """Fine-tune on ``synthetic`` and on a random subset of ``real`` with the same class counts.

    Returns ``{"synthetic": scores, "random_real": scores}`` (see :func:`fit_and_score`). The random
    subset reads the real data directly: it is a non-private reference point.
    """
    counts = dict(Counter(label for _, label in synthetic))
    baseline = matched_random_subset(real, counts, seed)
    return {
        "synthetic": fit_and_score(model, tokenizer, synthetic, test, template, label_words, config),
        "random_real": fit_and_score(model, tokenizer, baseline, test, template, label_words, config),
    }
