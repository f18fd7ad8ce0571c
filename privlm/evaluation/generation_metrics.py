"""Scores of generated completions against references, and the predictions file of a ``generate`` evaluation.

- **ROUGE-1 / ROUGE-2 / ROUGE-L F1** (:func:`rouge_f1`): Google's ``rouge-score`` package
  (``RougeScorer(use_stemmer=True)``: lowercased, non-alphanumerics dropped, Porter-stemmed tokens; ROUGE-L
  is the sentence-level LCS, not ``rougeLsum``), the F1 of each row averaged over rows;
- **exact match** (:func:`exact_match`): the share of rows whose generated text equals the reference
  after SQuAD's normalisation (:func:`normalize_answer`: lowercase, punctuation and the articles
  a/an/the removed, whitespace collapsed);
- :func:`write_predictions`: ``predictions.jsonl``, one ``{"index", "reference", "generated"}`` object per
  row, written atomically (:mod:`privlm.atomic`).
"""

from __future__ import annotations

import json
import os
import re
import string
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from privlm.atomic import write_text_atomic
from privlm.errors import UserError

ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")
PREDICTIONS_FILE = "predictions.jsonl"
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


class Prediction(NamedTuple):
    """One row of ``predictions.jsonl``."""

    index: int
    reference: str
    generated: str


def _check_pairs(references: Sequence[str], generated: Sequence[str]) -> None:
    if len(references) != len(generated):
        raise UserError(f"{len(generated)} generated texts for {len(references)} references")
    if not references:
        raise UserError("no rows to score")


def rouge_f1_per_row(references: Sequence[str], generated: Sequence[str]) -> dict[str, list[float]]:
    """``{"rouge1": [...], "rouge2": [...], "rougeL": [...]}``: the F1 of each row (stemmed; an empty text
    scores 0)."""
    from rouge_score import rouge_scorer  # imported here: it loads nltk

    _check_pairs(references, generated)
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    per_row: dict[str, list[float]] = {kind: [] for kind in ROUGE_TYPES}
    for reference, text in zip(references, generated):
        scores = scorer.score(reference, text)  # (target, prediction)
        for kind in ROUGE_TYPES:
            per_row[kind].append(float(scores[kind].fmeasure))
    return per_row


def rouge_f1(references: Sequence[str], generated: Sequence[str]) -> dict[str, float]:
    """Mean ROUGE-1, ROUGE-2 and ROUGE-L F1 over rows: ``{"rouge1", "rouge2", "rougeL"}``, each in [0, 1]."""
    return {kind: sum(values) / len(values) for kind, values in rouge_f1_per_row(references, generated).items()}


def normalize_answer(text: str) -> str:
    """SQuAD's answer normalisation: lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(references: Sequence[str], generated: Sequence[str]) -> float:
    """Share of rows whose generated text equals the reference after :func:`normalize_answer`."""
    _check_pairs(references, generated)
    hits = sum(normalize_answer(r) == normalize_answer(g) for r, g in zip(references, generated))
    return hits / len(references)


def generation_metrics(references: Sequence[str], generated: Sequence[str]) -> dict[str, float]:
    """``{"rouge1", "rouge2", "rougeL", "exact_match", "n"}`` of the generated texts."""
    return {**rouge_f1(references, generated), "exact_match": exact_match(references, generated), "n": len(references)}


def predictions(references: Sequence[str], generated: Sequence[str]) -> list[Prediction]:
    """``Prediction(i, reference, generated)`` of every row, in order (for :func:`write_predictions`)."""
    _check_pairs(references, generated)
    return [Prediction(i, r, g) for i, (r, g) in enumerate(zip(references, generated))]


def write_predictions(path: str | os.PathLike[str], rows: Iterable[Prediction | tuple[int, str, str]]) -> None:
    """Write ``rows`` (``(index, reference, generated)``) to ``path`` (conventionally ``predictions.jsonl``
    in the run folder) as one JSON object per line, UTF-8, atomically: a reader sees the old file or the
    whole new one."""
    lines = []
    for index, reference, generated in rows:
        lines.append(
            json.dumps({"index": int(index), "reference": reference, "generated": generated}, ensure_ascii=False) + "\n"
        )
    write_text_atomic(path, lines)
