"""Test metrics after training: label-word accuracy (classify), perplexity (lm) or ROUGE-1/2/L F1 and exact
match of greedy completions (generate) on the test split, and the per-example predictions
(``predictions.jsonl``: a classifier's test index, gold, predicted, per-class scores — from which paired
comparisons and confusion matrices are computed; a generator's index, reference, generated text)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.dpsgd.losses import IGNORE_INDEX, causal_lm_labels, token_losses
from privlm.evaluation.generation_metrics import Prediction, generation_metrics, predictions
from privlm.lm.completion import encode_prompt, greedy_complete
from privlm.lm.scoring import accuracy_ci, option_scores
from privlm.training.data import GENERATE_TEMPLATE, TaskData, encode, make_collate


def perplexity(model: PreTrainedModel, batches: list[dict[str, torch.Tensor]]) -> tuple[float, int]:
    """exp(mean next-token NLL) over every target token of ``batches``, and the number of tokens."""
    total, tokens = 0.0, 0
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for batch in batches:
                logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
                targets = causal_lm_labels(batch)
                total += float(token_losses(logits.float(), targets, "sum").sum())
                tokens += int((targets != IGNORE_INDEX).sum())
    finally:
        model.train(was_training)
    return (math.exp(total / tokens) if tokens else float("nan")), tokens


def label_word_scores(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data: TaskData,
    max_length: int,
    *,
    batch_size: int = 8,
    max_examples: int | None = None,
) -> np.ndarray:
    """Label-word scores (M, K) of the first ``max_examples`` test examples (:func:`option_scores`)."""
    test = data.test[:max_examples] if max_examples else data.test
    return option_scores(
        model,
        tokenizer,
        [t for t, _ in test],
        data.verbalizer.template,
        data.verbalizer.label_words,
        batch_size=batch_size,
        max_length=max_length,
    )


def classify_report(
    scores: np.ndarray, gold: Sequence[int], seed: int = 0
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Accuracy with its 95% bootstrap interval, and one record per test example (index, gold, predicted =
    argmax of the scores, the K scores), from ``scores`` (M, K) and the gold classes (M,)."""
    gold = np.asarray(gold)[: len(scores)]
    predicted = scores.argmax(axis=1)
    records = [
        {"index": i, "gold": int(y), "predicted": int(p), "scores": [float(v) for v in row]}
        for i, (y, p, row) in enumerate(zip(gold, predicted, scores))
    ]
    return accuracy_ci(predicted == gold, seed=seed).as_dict(), records


def test_metrics(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data: TaskData,
    max_length: int,
    *,
    batch_size: int = 8,
    max_examples: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Accuracy with its 95% bootstrap interval (classify) or perplexity (lm) on the first
    ``max_examples`` test examples (the test split is already shuffled by its seeded split)."""
    test = data.test[:max_examples] if max_examples else data.test
    if data.task == "classify":
        scores = label_word_scores(model, tokenizer, data, max_length, batch_size=batch_size, max_examples=max_examples)
        return classify_report(scores, [y for _, y in test], seed)[0]
    subset = TaskData(data.task, (), tuple(test), None)
    encoded = encode(subset, tokenizer, max_length, split="test")
    collate: Callable = make_collate(tokenizer)
    batches = [collate(encoded[i : i + batch_size]) for i in range(0, len(encoded), batch_size)]
    value, tokens = perplexity(model, batches)
    return {"perplexity": value, "n_test": len(encoded), "test_tokens": tokens}


def generation_report(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    data: TaskData,
    max_length: int,
    max_new_tokens: int,
    *,
    batch_size: int = 16,
    max_examples: int | None = None,
    on_batch: Callable[[int], None] | None = None,
) -> tuple[dict[str, Any], list[Prediction]]:
    """Greedy completions of the first ``max_examples`` test prompts (each cut to ``max_length −
    max_new_tokens`` tokens, :func:`~privlm.lm.completion.greedy_complete`) scored against their references:
    ``{"rouge1", "rouge2", "rougeL", "exact_match", "n", "prompts_cut"}`` (``prompts_cut``: test prompts whose
    body was cut to fit) and one :class:`~privlm.evaluation.generation_metrics.Prediction` per prompt.
    ``on_batch(n)`` after each decoded batch of n prompts (progress)."""
    test = data.test[:max_examples] if max_examples else data.test
    template = data.template or GENERATE_TEMPLATE
    prompts, references = [row.prompt for row in test], [row.completion for row in test]
    room = max_length - max_new_tokens
    cut = sum(
        encode_prompt(tokenizer, p, max_length=room, template=template, row=i)[1] > 0 for i, p in enumerate(prompts)
    )
    generated = greedy_complete(
        model,
        tokenizer,
        prompts,
        max_new_tokens=max_new_tokens,
        max_length=max_length,
        template=template,
        batch_size=batch_size,
        on_batch=on_batch,
    )
    metrics = {**generation_metrics(references, generated), "prompts_cut": cut}
    return metrics, predictions(references, generated)
