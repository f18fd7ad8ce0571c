"""Seeded subsets of labelled examples: a class-balanced private pool, its held-out twin, a test subset."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from privlm.errors import UserError
from privlm.lm.scoring import Example


def per_class_indices(labels: Sequence[int], n_per_class: int, seed: int, exclude: Sequence[int] = ()) -> list[int]:
    """``n_per_class`` indices of each class (sorted by label, then drawn order), none in ``exclude``.

    Draws with ``numpy.random.default_rng(seed)``; a class with too few examples is a ``UserError``.
    """
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    allowed = np.ones(len(labels), dtype=bool)
    allowed[list(exclude)] = False
    chosen: list[int] = []
    for c in np.unique(labels):
        candidates = np.flatnonzero((labels == c) & allowed)
        if len(candidates) < n_per_class:
            raise UserError(f"class {c} has {len(candidates)} available examples, fewer than {n_per_class} per class")
        chosen.extend(int(i) for i in rng.choice(candidates, size=n_per_class, replace=False))
    return chosen


def subsample(examples: Sequence[Example], n: int | None, seed: int) -> list[Example]:
    """A seeded uniform subset of ``n`` examples in their original order (all of them if ``n`` is None
    or at least ``len(examples)``)."""
    if n is None or n >= len(examples):
        return list(examples)
    keep = np.sort(np.random.default_rng(seed).choice(len(examples), size=n, replace=False))
    return [examples[i] for i in keep]
