"""Synthetic sets vs a random real subset of the same class counts: the check that ends ``make demo``."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

import numpy as np
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.evaluation.evaluate import fit_and_score
from privlm.lm.finetune_config import FinetuneConfig
from privlm.lm.scoring import Example


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


def sets_vs_random(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sets: Mapping[str, Sequence[Example]],
    real: Sequence[Example],
    test: Sequence[Example],
    template: str,
    label_words: Sequence[str],
    config: FinetuneConfig,
    seed: int = 0,
) -> dict[str, dict[str, object]]:
    """Fine-tune on each named synthetic set and once on a random subset of ``real`` whose class counts are
    the largest any set has (for one set: the same counts); score all on ``test``.

    Returns ``{name: scores, ..., "random_real": scores}`` (see :func:`fit_and_score`), fitted in that order.
    The random subset reads the real data directly: it is a non-private reference point.
    """
    if "random_real" in sets:
        raise ValueError("'random_real' names the real reference, not a synthetic set")
    counts: dict[int, int] = {}
    for examples in sets.values():
        for label, n in Counter(label for _, label in examples).items():
            counts[label] = max(counts.get(label, 0), n)
    baseline = matched_random_subset(real, counts, seed)
    scores = {
        name: fit_and_score(model, tokenizer, examples, test, template, label_words, config)
        for name, examples in sets.items()
    }
    scores["random_real"] = fit_and_score(model, tokenizer, baseline, test, template, label_words, config)
    return scores
