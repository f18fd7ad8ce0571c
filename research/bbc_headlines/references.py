"""The references of the bbc-headlines study, before any training: the lead-sentence baseline and zero-shot.

Both on the whole test split (seeded 80/10/10 split of the BBC articles, the one ``bbc-news`` uses):

- **lead**: the first sentence of the body (no model at all);
- **zero-shot**: SmolLM2-135M untrained, greedy decoding after either the plain prompt
  ``"{body}\\nHeadline: "`` (``HEADLINE_TEMPLATE``, the default of ``privlm train --task generate``) or
  the chat template's user turn "Write a one-line headline for this news article." with the body, the
  body cut to fit T = 1,024 with the completion's room kept, at most 24 new tokens, the first line kept.
  The prompt is chosen on the validation split (ROUGE-L) and only the chosen one is scored on test.

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
from privlm.lm.generation import chat_prompt
from privlm.resources.completions import load_completions
from privlm.resources.models import load_model
from privlm.resources.verbalizers import TEXT

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


def chat_template(tokenizer) -> str:
    """The chat prompt with ``{text}`` where the body goes (the body is cut there, the assistant turn kept)."""
    marker = "\x00BODY\x00"
    rendered = chat_prompt(tokenizer, f"Write a one-line headline for this news article.\n\n{marker}")
    return rendered.replace(marker, TEXT)


def zero_shot(model, tokenizer, prompts: list[str], template: str) -> list[str]:
    return greedy_complete(
        model,
        tokenizer,
        prompts,
        max_new_tokens=MAX_NEW_TOKENS,
        max_length=MAX_LENGTH,
        template=template,
        batch_size=8,
    )


def main() -> None:
    validation = load_completions("bbc-headlines", split="validation")
    test = load_completions("bbc-headlines", split="test")
    references = test.completions
    start = time.perf_counter()
    model, tokenizer = load_model("smollm2-135m")
    templates = {"plain": HEADLINE_TEMPLATE, "chat": chat_template(tokenizer)}
    on_validation = {
        name: generation_metrics(validation.completions, zero_shot(model, tokenizer, validation.prompts, template))
        for name, template in templates.items()
    }
    chosen = max(on_validation, key=lambda name: on_validation[name]["rougeL"])
    generated = {
        "lead": [lead_sentence(p) for p in test.prompts],
        "zero_shot": zero_shot(model, tokenizer, test.prompts, templates[chosen]),
    }
    wall = time.perf_counter() - start
    per_row = {name: rouge_f1_per_row(references, gens) for name, gens in generated.items()}
    result = {
        "split": "test",
        "n": len(references),
        "max_length": MAX_LENGTH,
        "max_new_tokens": MAX_NEW_TOKENS,
        "zero_shot_prompts_on_validation": on_validation,
        "zero_shot_prompt_chosen": chosen,
        "template": templates[chosen],
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
