"""Synthetic-vs-random comparison: the random subset matches the class counts; both are scored."""

from __future__ import annotations

from collections import Counter

import pytest

from privlm.errors import UserError
from privlm.evaluation.compare import matched_random_subset, sets_vs_random
from privlm.evaluation.evaluate import fit_and_score
from privlm.lm.finetune_config import preset
from privlm.lm.scoring import evaluate_accuracy
from privlm.resources.tiny import build_tiny_model

REAL = [(f"the film is warm number {i}", 1) for i in range(12)] + [
    (f"the film is dull number {i}", 0) for i in range(9)
]


def test_matched_random_subset_has_the_same_class_counts_and_is_seeded() -> None:
    sub = matched_random_subset(REAL, {0: 3, 1: 2}, seed=5)
    assert Counter(y for _, y in sub) == {0: 3, 1: 2} and set(sub) <= set(REAL)
    assert sub == matched_random_subset(REAL, {0: 3, 1: 2}, seed=5)
    with pytest.raises(UserError, match="class 0 has 9 real examples, fewer than the 10"):
        matched_random_subset(REAL, {0: 10}, seed=0)


def test_one_set_vs_random_scores_both_training_sets() -> None:
    model, tok = build_tiny_model("tiny-llama", seed=0)
    synthetic = [("warm warm warm", 1), ("dull dull dull", 0), ("warm and warm", 1), ("dull and dull", 0)]
    test = REAL[:4] + REAL[-4:]
    config = preset("tiny", epochs=3)
    got = sets_vs_random(model, tok, {"synthetic": synthetic}, REAL, test, " It was ", ["bad", "great"], config, seed=1)
    assert got["synthetic"]["n_train"] == got["random_real"]["n_train"] == 4
    # The baseline is the matched random subset (same seed), fine-tuned and scored like the synthetic set.
    baseline = matched_random_subset(REAL, {1: 2, 0: 2}, seed=1)
    assert got["random_real"] == fit_and_score(model, tok, baseline, test, " It was ", ["bad", "great"], config)
    assert 0 <= got["synthetic"]["accuracy"] <= 1
    assert evaluate_accuracy(model, tok, test, " It was ", ["bad", "great"]).n == got["synthetic"]["n_test"]


def test_sets_vs_random_fits_the_real_reference_once_at_the_largest_class_counts(monkeypatch) -> None:
    from privlm.evaluation import compare

    fitted: list[list] = []
    monkeypatch.setattr(compare, "fit_and_score", lambda _m, _t, train, *_: fitted.append(list(train)) or {})
    sets = {"a": [("x", 0), ("y", 1), ("z", 1)], "b": [("u", 0), ("v", 0)]}
    got = compare.sets_vs_random(None, None, sets, REAL, [], " It was ", ["bad", "great"], preset("tiny"), seed=2)
    assert list(got) == ["a", "b", "random_real"] and len(fitted) == 3
    assert fitted[2] == matched_random_subset(REAL, {0: 2, 1: 2}, seed=2)
