"""Real-data coresets of n examples per class: random, herding, k-center greedy.

Selections run per class on feature vectors (by default the model's last-token hidden states,
:func:`privlm.lm.features.last_token_features`) and return indices into the pool. These baselines read the
private pool directly: they carry no privacy guarantee and are reference points, not private methods.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from privlm.errors import UserError


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
