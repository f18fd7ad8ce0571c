"""Stratified splits: properties on random label vectors, on every built-in dataset, and reproducibility;
per-row splits of user data: adding a row never moves another."""

from __future__ import annotations

import hashlib
import json
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
from privlm.resources.splits import (
    SPLITS,
    check_split,
    groups_of_identical,
    per_row_split,
    row_split,
    stratified_split,
)


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
        repr([load_dataset(n, split=s, seed=7).examples for n in ("tweets", "bbc-news") for s in SPLITS]).encode()
    ).hexdigest()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run([sys.executable, "-c", DIGEST], env=env, capture_output=True, text=True, check=True)
        assert out.stdout.strip() == here


def test_unknown_split() -> None:
    assert check_split(None) is None and check_split("test") == "test"
    with pytest.raises(UserError, match="unknown split 'dev'; choose one of train, validation, test"):
        load_dataset("tweets", split="dev")


def _split_of(texts: list[str], seed: int) -> dict[int, str]:
    return {int(i): name for name, idx in per_row_split(texts, seed).items() for i in idx}


@settings(max_examples=80, deadline=None)
@given(
    st.lists(st.text(min_size=1, max_size=12), min_size=0, max_size=120),
    st.text(min_size=1, max_size=12),
    st.integers(0, 10**6),
    st.integers(0, 2**32 - 1),
)
def test_adding_one_row_moves_no_other_row(texts: list[str], added: str, where: int, seed: int) -> None:
    """User data: each row's split is its own (text, seed) function, and the others' order within a split is kept."""
    position = where % (len(texts) + 1)
    bigger = texts[:position] + [added] + texts[position:]
    before, after = per_row_split(texts, seed), per_row_split(bigger, seed)
    for name in SPLITS:
        kept = [j if j < position else j - 1 for j in after[name].tolist() if j != position]
        assert kept == before[name].tolist()  # same rows, same relative order
    split_before, split_after = _split_of(texts, seed), _split_of(bigger, seed)
    assert all(
        split_after[j] == split_before[j if j < position else j - 1] for j in range(len(bigger)) if j != position
    )
    assert split_after[position] == row_split(added, seed)


def test_per_row_split_partitions_keeps_identical_texts_together_and_is_about_80_10_10() -> None:
    texts = [f"row {i % 1500}" for i in range(3000)]  # every text twice
    parts = per_row_split(texts, 0)
    assert sorted(np.concatenate([parts[n] for n in SPLITS]).tolist()) == list(range(3000))
    split_of = _split_of(texts, 0)
    assert all(split_of[i] == split_of[i + 1500] for i in range(1500))
    sizes = {n: len(parts[n]) / 3000 for n in SPLITS}
    assert (
        abs(sizes["train"] - 0.8) < 0.05 and abs(sizes["validation"] - 0.1) < 0.03 and abs(sizes["test"] - 0.1) < 0.03
    )
    assert _split_of(texts, 1) != split_of  # the seed matters
    # pinned: a user file's split must not change between versions or machines
    assert [row_split(f"text {i}", 0) for i in (0, 5, 9, 16, 18)] == [
        "train",
        "validation",
        "test",
        "validation",
        "test",
    ]


def test_adding_one_row_to_a_user_file_moves_no_other_row(tmp_path) -> None:
    rng = np.random.default_rng(0)
    rows = [{"text": f"review number {i}", "label": int(rng.integers(2))} for i in range(200)]
    for trial in range(5):
        position = int(rng.integers(len(rows) + 1))
        extra = {"text": f"added review {trial}", "label": int(rng.integers(2))}
        small, big = tmp_path / f"small{trial}.jsonl", tmp_path / f"big{trial}.jsonl"
        small.write_text("".join(json.dumps(r) + "\n" for r in rows))
        big.write_text("".join(json.dumps(r) + "\n" for r in [*rows[:position], extra, *rows[position:]]))
        for split in SPLITS:
            a = load_dataset(f"jsonl:{small}", split=split, labels="neg,pos").examples
            b = load_dataset(f"jsonl:{big}", split=split, labels="neg,pos").examples
            assert [e for e in b if e[0] != extra["text"]] == list(a)
