"""Stratified splits: properties on random label vectors, on every built-in dataset, and reproducibility."""

from __future__ import annotations

import hashlib
import math
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from privlm.errors import UserError
from privlm.resources.datasets import BUILTIN, load_dataset
from privlm.resources.splits import SPLITS, check_split, groups_of_identical, stratified_split


def assert_stratified_partition(labels: list[int], parts: dict[str, np.ndarray], groups: list[int]) -> None:
    every = np.concatenate([parts[name] for name in SPLITS])
    assert sorted(every.tolist()) == list(range(len(labels)))
    split_of_group: dict[int, set[str]] = {}
    for name in SPLITS:
        for i in parts[name]:
            split_of_group.setdefault(groups[i], set()).add(name)
    assert all(len(names) == 1 for names in split_of_group.values())
    group_label = {}
    for i, group in enumerate(groups):
        group_label.setdefault(group, labels[i])
    per_class = Counter(group_label.values())
    expected = {name: +Counter({c: math.floor(0.1 * n + 0.5) for c, n in per_class.items()}) for name in SPLITS[1:]}
    expected["train"] = +Counter({c: n - 2 * math.floor(0.1 * n + 0.5) for c, n in per_class.items()})
    for name in SPLITS:
        groups_here = {groups[i] for i in parts[name]}
        assert Counter(group_label[g] for g in groups_here) == expected[name]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 4), min_size=1, max_size=300), st.integers(0, 2**32 - 1))
def test_partition_is_disjoint_complete_and_stratified(labels: list[int], seed: int) -> None:
    parts = stratified_split(labels, seed)
    assert_stratified_partition(labels, parts, list(range(len(labels))))
    again = stratified_split(labels, seed)
    assert all(np.array_equal(parts[name], again[name]) for name in SPLITS)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 40)), min_size=1, max_size=300), st.integers(0, 99))
def test_groups_stay_together(pairs: list[tuple[int, int]], seed: int) -> None:
    labels, groups = [label for label, _ in pairs], [group for _, group in pairs]
    assert_stratified_partition(labels, stratified_split(labels, seed, groups=groups), groups)


def test_identical_texts_share_a_group() -> None:
    assert groups_of_identical(["a", "b", "a", "c", "b"]) == [0, 1, 0, 3, 1]


def test_seed_changes_the_split() -> None:
    labels = [i % 3 for i in range(600)]
    a, b = stratified_split(labels, 0), stratified_split(labels, 1)
    assert not np.array_equal(np.sort(a["test"]), np.sort(b["test"]))


@pytest.mark.parametrize("name", sorted(BUILTIN))
def test_builtin_splits(name: str) -> None:
    full = load_dataset(name)
    groups = groups_of_identical(full.texts)
    assert_stratified_partition(full.labels, stratified_split(full.labels, 0, groups=groups), groups)
    parts = {split: load_dataset(name, split=split) for split in SPLITS}
    texts = [set(parts[split].texts) for split in SPLITS]
    assert not (texts[0] & texts[1] or texts[0] & texts[2] or texts[1] & texts[2])
    assert {split: len(part) for split, part in parts.items()} == full.split_sizes
    assert Counter(full.examples) == sum((Counter(part.examples) for part in parts.values()), Counter())
    for part in parts.values():
        assert all(count > 0 for count in part.class_counts().values())


DIGEST = (
    "import hashlib; from privlm.resources.datasets import load_dataset; "
    "print(hashlib.sha256(repr([load_dataset(n, split=s, seed=7).examples for n in ('tweets', 'bbc-news') "
    "for s in ('train', 'validation', 'test')]).encode()).hexdigest())"
)


def test_same_split_in_fresh_processes_with_different_hash_seeds() -> None:
    here = hashlib.sha256(
        repr(
            [load_dataset(n, split=s, seed=7).examples for n in ("tweets", "bbc-news") for s in SPLITS]
        ).encode()
    ).hexdigest()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", DIGEST], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == here


def test_unknown_split() -> None:
    assert check_split(None) is None and check_split("test") == "test"
    with pytest.raises(UserError, match="unknown split 'dev'; choose one of train, validation, test"):
        load_dataset("tweets", split="dev")
