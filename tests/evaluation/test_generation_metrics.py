"""ROUGE F1 against counts made by hand, SQuAD exact match, and the atomic predictions file."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from privlm import atomic
from privlm.errors import UserError
from privlm.evaluation.generation_metrics import (
    Prediction,
    exact_match,
    generation_metrics,
    normalize_answer,
    predictions,
    rouge_f1,
    rouge_f1_per_row,
    write_predictions,
)

# two short pairs, counted by hand below (reference first, generated second)
REFERENCES = ["The cat sat on the mat.", "Shares jumped sharply"]
GENERATED = ["the cat lay on a mat", "share jumps"]


def f1(overlap: int, n_generated: int, n_reference: int) -> float:
    precision, recall = overlap / n_generated, overlap / n_reference
    return 2 * precision * recall / (precision + recall)


def test_rouge_matches_counts_by_hand() -> None:
    # pair 1: tokens "the cat sat on the mat" / "the cat lay on a mat" (6 and 6). Unigrams in common, with
    # clipped counts: the (min(2, 1) = 1), cat, on, mat -> 4. Bigrams: only "the cat" of 5 and 5. The longest
    # common subsequence: the cat on mat -> 4.
    # pair 2 (Porter stems): "share jump sharpli" / "share jump" (3 and 2). Unigrams: share, jump -> 2;
    # bigrams: "share jump" of 2 and 1; LCS 2.
    want_rows = {
        "rouge1": [f1(4, 6, 6), f1(2, 2, 3)],
        "rouge2": [f1(1, 5, 5), f1(1, 1, 2)],
        "rougeL": [f1(4, 6, 6), f1(2, 2, 3)],
    }
    assert want_rows["rouge1"] == pytest.approx([2 / 3, 0.8]) and want_rows["rouge2"] == pytest.approx([0.2, 2 / 3])
    got_rows = rouge_f1_per_row(REFERENCES, GENERATED)
    for kind, values in want_rows.items():
        assert got_rows[kind] == pytest.approx(values, abs=1e-12)
    means = rouge_f1(REFERENCES, GENERATED)
    assert means == pytest.approx({kind: sum(v) / 2 for kind, v in want_rows.items()}, abs=1e-12)


def test_rouge1_equals_an_independent_unigram_count() -> None:
    reference, generated = "the market rose as shares in tech gained", "shares in tech rose as the market fell"
    ref, gen = (
        Counter(reference.split()),
        Counter(generated.split()),
    )  # stemming maps equal words alike and merges no others
    overlap = sum((ref & gen).values())
    assert overlap == 7
    assert rouge_f1([reference], [generated])["rouge1"] == pytest.approx(f1(overlap, 8, 8))
    assert rouge_f1([reference], [generated])["rouge2"] < rouge_f1([reference], [generated])["rouge1"]


def test_rouge_extremes_and_errors() -> None:
    assert rouge_f1(["Ad sales boost profit"], ["ad SALES boost profit!"]) == pytest.approx(
        {"rouge1": 1.0, "rouge2": 1.0, "rougeL": 1.0}
    )
    assert rouge_f1(["Ad sales boost profit"], [""]) == {"rouge1": 0.0, "rouge2": 0.0, "rougeL": 0.0}
    with pytest.raises(UserError, match="1 generated texts for 2 references"):
        rouge_f1(["a", "b"], ["a"])
    with pytest.raises(UserError, match="no rows"):
        exact_match([], [])


def test_squad_normalisation_and_exact_match() -> None:
    assert normalize_answer("  The Cat's   hat, an apple!  ") == "cats hat apple"
    assert normalize_answer("Theatre and a band") == "theatre and band"  # only whole-word articles go
    refs = ["The Cat sat.", "Shares gain", "Big win"]
    gens = ["cat  sat", "Shares gained", "a big WIN!"]
    assert exact_match(refs, gens) == pytest.approx(2 / 3)
    metrics = generation_metrics(refs, gens)
    assert set(metrics) == {"rouge1", "rouge2", "rougeL", "exact_match", "n"} and metrics["n"] == 3


def test_write_predictions_is_jsonl_and_atomic(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "run" / "predictions.jsonl"
    rows = predictions(["Ad sales £600m", "Two"], ["ad sales", "Three\nlines"])
    assert rows[1] == Prediction(1, "Two", "Three\nlines")
    write_predictions(path, rows)
    lines = path.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line) for line in lines] == [
        {"index": 0, "reference": "Ad sales £600m", "generated": "ad sales"},
        {"index": 1, "reference": "Two", "generated": "Three\nlines"},
    ]
    assert list(json.loads(lines[0])) == ["index", "reference", "generated"]

    def crash(*args, **kwargs):
        raise RuntimeError("killed mid-write")

    monkeypatch.setattr(atomic.os, "replace", crash)
    with pytest.raises(RuntimeError):
        write_predictions(path, [(0, "new", "rows")])
    assert path.read_text(encoding="utf-8").splitlines() == lines  # the old file, whole
    assert sorted(p.name for p in path.parent.iterdir()) == ["predictions.jsonl"]  # no temporary left
