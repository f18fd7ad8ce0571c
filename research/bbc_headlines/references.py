"""The references of the bbc-headlines study, before any training: the lead-sentence baseline and zero-shot.

Both on the whole test split (seeded 80/10/10 split of the BBC articles, the one ``bbc-news`` uses):

- **lead**: the first sentence of the body (no model at all);
- **zero-shot**: SmolLM2-135M untrained, greedy decoding after the plain prompt ``"{body}\\nHeadline: "``
  (``HEADLINE_TEMPLATE``, the default of ``privlm train --task generate``), the body cut to fit T = 1,024
  with the completion's room kept, at most 24 new tokens, the first line kept.

ROUGE-1/2/L F1 with stemming (``rouge-score``) and exact match, per row and mean, and a paired bootstrap
interval of zero-shot − lead on ROUGE-L. Writes ``references.json`` and ``predictions-<name>.jsonl``.

    .venv/bin/python research/bbc_headlines/references.py
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import numpy as np

from privlm.atomic import write_text_atomic
from privlm.evaluation.generation_metrics import generation_metrics, rouge_f1_per_row, write_predictions
from privlm.lm.completion import HEADLINE_TEMPLATE, greedy_complete
from privlm.resources.completions import load_completions
from privlm.resources.models import load_model

OUT = Path(__file__).resolve().parent
MAX_LENGTH, MAX_NEW_TOKENS = 1024, 24
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def lead_sentence(body: str) -> str:
    """The first sentence of ``body`` (up to the first ., ! or ? followed by white space)."""
    return _SENTENCE_END.split(body.strip(), maxsplit=1)[0]


def paired_interval(a: list[float], b: list[float], draws: int = 10_000, seed: int = 0) -> list[float]:
    """95 % paired bootstrap interval of mean(a) − mean(b) over rows (points)."""
    diff = np.asarray(a) - np.asarray(b)
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), (draws, len(diff)))].mean(axis=1)
    return [float(100 * np.percentile(means, 2.5)), float(100 * np.percentile(means, 97.5))]


def main() -> None:
    test = load_completions("bbc-headlines", split="test")
    references = test.completions
    start = time.perf_counter()
    generated = {"lead": [lead_sentence(p) for p in test.prompts]}
    model, tokenizer = load_model("smollm2-135m")
    generated["zero_shot"] = greedy_complete(
        model,
        tokenizer,
        test.prompts,
        max_new_tokens=MAX_NEW_TOKENS,
        max_length=MAX_LENGTH,
        template=HEADLINE_TEMPLATE,
        batch_size=8,
    )
    wall = time.perf_counter() - start
    per_row = {name: rouge_f1_per_row(references, gens) for name, gens in generated.items()}
    result = {
        "split": "test",
        "n": len(references),
        "max_length": MAX_LENGTH,
        "max_new_tokens": MAX_NEW_TOKENS,
        "template": HEADLINE_TEMPLATE,
        "metrics": {name: generation_metrics(references, gens) for name, gens in generated.items()},
        "zero_shot_minus_lead_rougeL_points_95ci": paired_interval(
            per_row["zero_shot"]["rougeL"], per_row["lead"]["rougeL"]
        ),
        "wall_s": round(wall, 1),
        "command": "python research/bbc_headlines/references.py",
    }
    for name, gens in generated.items():
        write_predictions(OUT / f"predictions-{name}.jsonl", list(zip(range(len(gens)), references, gens)))
    write_text_atomic(OUT / "references.json", json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["metrics"], indent=2), result["zero_shot_minus_lead_rougeL_points_95ci"])


if __name__ == "__main__":
    main()
