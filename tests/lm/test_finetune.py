"""Label-word fine-tuning on tiny models: it learns, leaves the input model alone, selects on validation."""

from __future__ import annotations

import random

import pytest
import torch

from privlm.errors import UserError
from privlm.lm.finetune import finetune_classifier, select_and_finetune
from privlm.lm.finetune_config import FinetuneConfig, preset
from privlm.lm.scoring import evaluate_accuracy
from privlm.resources.tiny import build_tiny_model

SUFFIX = " It was "
WORDS = ["bad", "great"]
GOOD = ["warm", "funny", "moving", "smart", "honest", "wonderful", "delight", "loved"]
BAD = ["slow", "dull", "wooden", "worst", "terrible", "sad", "tired", "long"]
FILLER = ["the film is", "this movie was", "a story that is", "the cast is", "the plot was", "the picture is"]


def keyword_task(n: int, seed: int) -> list[tuple[str, int]]:
    """Sentences whose label is given by a sentiment keyword: learnable by a tiny model."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        label = i % 2
        words = rng.sample(GOOD if label else BAD, 2)
        rows.append((f"{rng.choice(FILLER)} {words[0]} and {words[1]}", label))
    return rows


TRAIN, VALID, TEST = keyword_task(32, 0), keyword_task(24, 1), keyword_task(40, 2)


def params_of(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def test_full_finetuning_learns_keyword_task_and_leaves_input_model_unchanged() -> None:
    model, tok = build_tiny_model("tiny-llama", seed=0)
    model.requires_grad_(False)  # as GRADMM leaves a shared model: fine-tuning must still train all weights
    before = params_of(model)
    start = evaluate_accuracy(model, tok, TEST, SUFFIX, WORDS).value
    result = finetune_classifier(model, tok, TRAIN, SUFFIX, WORDS, preset("tiny"))
    after = evaluate_accuracy(result.model, tok, TEST, SUFFIX, WORDS).value
    assert start < 0.7 and after >= 0.9, (start, after)
    assert result.history[-1]["train_loss"] < result.history[0]["train_loss"]
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert not any(p.requires_grad for p in model.parameters())
    assert not result.model.training


def test_lora_on_gpt2_conv1d_learns_and_returns_a_merged_plain_model() -> None:
    model, tok = build_tiny_model("tiny-gpt2", seed=0)
    config = preset("tiny", lora_rank=4, lora_alpha=8, lr=1e-2)
    result = finetune_classifier(model, tok, TRAIN, SUFFIX, WORDS, config)
    assert type(result.model) is type(model)
    assert evaluate_accuracy(result.model, tok, TEST, SUFFIX, WORDS).value >= 0.85
    # Embeddings are not LoRA targets, so merging leaves them as they were.
    assert torch.equal(result.model.transformer.wte.weight, model.transformer.wte.weight)


def test_validation_keeps_the_best_epoch_weights_and_runs_are_seeded() -> None:
    model, tok = build_tiny_model("tiny-llama", seed=1)
    config = preset("tiny", epochs=6, lr=1e-2)
    result = finetune_classifier(model, tok, TRAIN, SUFFIX, WORDS, config, validation=VALID)
    accs = [h["validation_accuracy"] for h in result.history]
    assert result.best_epoch == accs.index(max(accs)) + 1
    assert evaluate_accuracy(result.model, tok, VALID, SUFFIX, WORDS).value == result.validation_accuracy == max(accs)
    again = finetune_classifier(model, tok, TRAIN, SUFFIX, WORDS, config, validation=VALID)
    assert again.history == result.history


def test_grid_selection_keeps_the_best_validation_configuration() -> None:
    model, tok = build_tiny_model("tiny-llama", seed=0)
    grid = [preset("tiny", epochs=2, lr=1e-5), preset("tiny", epochs=4, lr=3e-3)]
    result, rows = select_and_finetune(model, tok, TRAIN, VALID, SUFFIX, WORDS, grid)
    accs = [r["validation_accuracy"] for r in rows]
    assert result.config == grid[accs.index(max(accs))]
    assert result.validation_accuracy == max(accs)
    assert [r["lr"] for r in rows] == [1e-5, 3e-3]


def test_bad_input_is_refused() -> None:
    model, tok = build_tiny_model("tiny-llama")
    with pytest.raises(UserError, match="label 2"):
        finetune_classifier(model, tok, [("x", 2)], SUFFIX, WORDS, preset("tiny"))
    with pytest.raises(UserError, match="epochs"):
        FinetuneConfig(epochs=0)
    with pytest.raises(UserError, match="nope"):
        preset("nope")
