"""Real-data coresets of n examples per class: random, herding, k-center greedy.

Selections run per class on feature vectors (by default the model's last-token hidden states, see
:func:`last_token_features`) and return indices into the pool. These baselines read the private pool
directly: they carry no privacy guarantee and are reference points, not private methods.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.resources.padding import padded_batch, shape_buckets
from privlm.evaluation.prompts import pad_token_id


def last_token_features(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    batch_size: int = 16,
    max_length: int = 128,
) -> np.ndarray:
    """Final hidden state (after the final norm) at each text's last real token, ``(len(texts), hidden)``:
    :func:`hidden_features` with ``pooling="last"``."""
    return hidden_features(model, tokenizer, texts, "last", batch_size, max_length)


def hidden_features(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    pooling: str = "last",
    batch_size: int = 16,
    max_length: int = 128,
    fixed_shape: bool = False,
) -> np.ndarray:
    """Final hidden states (after the final norm) of each text, ``(len(texts), hidden)``, float64: at the
    last real token (``pooling="last"``) or averaged over the real tokens (``"mean"``).

    Computed by the model's backbone (``model.base_model``), without the LM head. Right padding with an
    attention mask; texts longer than ``max_length`` tokens keep their end. ``fixed_shape``: every batch
    is ``batch_size`` rows of a public width chosen by each text's own length (private texts: a text's
    features then do not depend on which others share its batch, :func:`privlm.resources.padding.shape_buckets`).
    """
    if pooling not in ("last", "mean"):
        raise UserError(f"pooling must be 'last' or 'mean', got {pooling!r}")
    encoded = [tokenizer(t, add_special_tokens=True)["input_ids"][-max_length:] for t in texts]
    if any(len(ids) == 0 for ids in encoded):
        raise UserError("a text encodes to no tokens; cannot take its hidden-state features")
    pad = pad_token_id(tokenizer)
    if fixed_shape:
        batches = shape_buckets([len(ids) for ids in encoded], batch_size, max_length)
    else:
        batches = [(list(range(s, min(s + batch_size, len(encoded)))), None) for s in range(0, len(encoded), batch_size)]
    out: np.ndarray | None = None  # (len(texts), width of the backbone's output), allocated at the first batch
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for indices, width in batches:
                chunk = [encoded[i] for i in indices]
                ids, mask, lengths = padded_batch(chunk, pad, width=width, rows=batch_size if fixed_shape else None)
                hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state[: len(chunk)]  # no LM head
                if pooling == "mean":
                    weights = mask[: len(chunk)].to(hidden.dtype)[:, :, None]
                    pooled = ((hidden * weights).sum(1) / weights.sum(1)).double().numpy()
                else:
                    pooled = hidden[torch.arange(len(chunk)), lengths - 1].double().numpy()
                if out is None:
                    out = np.zeros((len(encoded), pooled.shape[1]))
                out[indices] = pooled
    finally:
        model.train(was_training)
    return out if out is not None else np.zeros((0, model.config.hidden_size))


def herding(features: np.ndarray, k: int) -> list[int]:
    """Greedy mean matching (Welling 2009; iCaRL): the j-th pick minimises ‖μ − mean(picked + x)‖.

    ``features`` has shape ``(m, d)``; picks are without replacement, ties go to the lowest index.
    """
    mean = features.mean(axis=0)
    chosen: list[int] = []
    running = np.zeros_like(mean)
    available = np.ones(len(features), dtype=bool)
    for j in range(1, k + 1):
        gap = np.linalg.norm(mean - (running + features) / j, axis=1)
        gap[~available] = np.inf
        pick = int(np.argmin(gap))
        chosen.append(pick)
        available[pick] = False
        running += features[pick]
    return chosen


def k_center_greedy(features: np.ndarray, k: int, seed: int) -> list[int]:
    """Farthest-point traversal (Gonzalez 1985; Sener & Savarese 2018), a 2-approximation of k-center.

    The first center is drawn uniformly with ``numpy.random.default_rng(seed)``; each next one is the
    point farthest (Euclidean) from its nearest chosen center, ties to the lowest index.
    """
    first = int(np.random.default_rng(seed).integers(len(features)))
    chosen = [first]
    nearest = np.linalg.norm(features - features[first], axis=1)
    for _ in range(k - 1):
        pick = int(np.argmax(nearest))
        chosen.append(pick)
        nearest = np.minimum(nearest, np.linalg.norm(features - features[pick], axis=1))
    return chosen


def random_subset(features: np.ndarray, k: int, seed: int) -> list[int]:
    """``k`` distinct indices drawn uniformly with ``numpy.random.default_rng(seed)``."""
    return [int(i) for i in np.random.default_rng(seed).choice(len(features), size=k, replace=False)]


SELECTORS: dict[str, Callable[[np.ndarray, int, int], list[int]]] = {
    "random": random_subset,
    "herding": lambda features, k, seed: herding(features, k),
    "k-center": k_center_greedy,
}
USES_FEATURES = frozenset({"herding", "k-center"})  # "random" draws from the indices alone


def select_per_class(
    method: str, features: np.ndarray, labels: Sequence[int], n_per_class: int, seed: int = 0
) -> list[int]:
    """Indices into the pool: ``n_per_class`` per class chosen by ``method`` within that class.

    Classes are visited in increasing label order; class ``c`` uses seed ``seed + c``.
    """
    if method not in SELECTORS:
        raise UserError(f"unknown coreset method {method!r}; known: {', '.join(SELECTORS)}")
    labels = np.asarray(labels)
    if len(labels) != len(features):
        raise UserError(f"{len(features)} feature rows for {len(labels)} labels")
    chosen: list[int] = []
    for c in np.unique(labels):
        members = np.flatnonzero(labels == c)
        if len(members) < n_per_class:
            raise UserError(f"class {c} has {len(members)} examples in the pool, fewer than n={n_per_class}")
        picks = SELECTORS[method](features[members], n_per_class, seed + int(c))
        chosen.extend(int(members[i]) for i in picks)
    return chosen
