"""Seeded, stratified train / validation / test splits that are identical on every machine.

Each class is split on its own (stratification): its examples, in source order, are shuffled and
cut into round(f·n_c) validation and test examples, the rest going to training. Each split is then
put in a seeded random order. Shuffles sort the examples by keys drawn from the raw 64-bit stream of
``numpy.random.PCG64(seed)`` (stable sort), which is fixed by the PCG64 and SeedSequence algorithms;
NumPy's ``Generator.permutation`` is not used because NEP 19 lets it change between versions. The
result therefore depends only on the labels' order and the seed — not on hash seeds, the file
system, the platform or the NumPy version.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from privlm.errors import UserError

SPLITS = ("train", "validation", "test")
FRACTIONS = {"validation": 0.1, "test": 0.1}


def stratified_split(labels: Sequence[int], seed: int = 0) -> dict[str, np.ndarray]:
    """Indices of each split: ``{"train": idx, "validation": idx, "test": idx}`` (int64 arrays).

    The three index sets are disjoint and cover ``range(len(labels))``; in every class with
    ``n_c`` examples, validation and test get ``floor(0.1·n_c + 0.5)`` each.
    """
    labels = np.asarray(labels, dtype=np.int64)
    bits = np.random.PCG64(seed)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in SPLITS}
    for label in np.unique(labels):
        members = _shuffle(bits, np.flatnonzero(labels == label))
        start = 0
        for name in ("validation", "test"):
            size = math.floor(FRACTIONS[name] * len(members) + 0.5)
            parts[name].append(members[start : start + size])
            start += size
        parts["train"].append(members[start:])
    return {name: _shuffle(bits, np.concatenate(parts[name] or [np.empty(0, np.int64)])) for name in SPLITS}


def _shuffle(bits: np.random.PCG64, items: np.ndarray) -> np.ndarray:
    """``items`` in the order of one fresh raw 64-bit key each (version-stable shuffle)."""
    return items[np.argsort(bits.random_raw(len(items)), kind="stable")]


def check_split(split: str | None) -> str | None:
    """``split`` if it is ``None`` or a known split name, else :class:`UserError`."""
    if split is not None and split not in SPLITS:
        raise UserError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    return split
