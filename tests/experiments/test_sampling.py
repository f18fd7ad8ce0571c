"""Seeded class-balanced pools and subsets."""

from __future__ import annotations

import pytest

from privlm.errors import UserError
from privlm.experiments.sampling import per_class_indices, subsample


def test_per_class_indices_are_balanced_disjoint_from_exclude_and_seeded() -> None:
    labels = [i % 3 for i in range(60)]
    pool = per_class_indices(labels, 5, seed=0)
    assert sorted(labels[i] for i in pool) == [0] * 5 + [1] * 5 + [2] * 5
    held_out = per_class_indices(labels, 5, seed=1, exclude=pool)
    assert not set(pool) & set(held_out) and len(set(held_out)) == 15
    assert per_class_indices(labels, 5, seed=0) == pool != per_class_indices(labels, 5, seed=2)
    with pytest.raises(UserError, match="class 0 has 20 available examples, fewer than 21"):
        per_class_indices(labels, 21, seed=0)


def test_subsample_keeps_order_and_size() -> None:
    examples = [(str(i), i % 2) for i in range(50)]
    sub = subsample(examples, 10, seed=3)
    assert len(sub) == 10 and sub == sorted(sub, key=lambda e: int(e[0])) and set(sub) <= set(examples)
    assert subsample(examples, None, 0) == examples == subsample(examples, 80, 0)
