"""Test metrics after training: label-word accuracy (classify) or perplexity (lm) on the test split."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.dpsgd.losses import IGNORE_INDEX, causal_lm_labels, token_losses
from privlm.evaluation.scoring import evaluate_accuracy
from privlm.training.data import TaskData, encode, make_collate


def perplexity(
    model: PreTrainedModel, batches: list[dict[str, torch.Tensor]]
) -> tuple[float, int]:
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
        accuracy = evaluate_accuracy(
            model, tokenizer, test, data.verbalizer.suffix, data.verbalizer.label_words,
            batch_size=batch_size, max_length=max_length, seed=seed,
        )
        return accuracy.as_dict()
    subset = TaskData(data.task, (), tuple(test), None)
    encoded = encode(subset, tokenizer, max_length, split="test")
    collate: Callable = make_collate(tokenizer)
    batches = [collate(encoded[i : i + batch_size]) for i in range(0, len(encoded), batch_size)]
    value, tokens = perplexity(model, batches)
    return {"perplexity": value, "n_test": len(encoded), "test_tokens": tokens}
