"""Token-level per-sample losses for causal LMs.

The per-sample loss is the sum (or the mean) of next-token cross-entropies over that sample's
*unmasked* target tokens. Targets equal to ``ignore_index`` and positions whose target is padding
(``attention_mask == 0``) contribute nothing; a sample with no target token has loss 0.

The label-word objective of a classifier (:func:`label_word_lm_losses`) is a K-way cross-entropy over the
logits of the K label words' first tokens at the position that predicts the label word: the whole
clipped gradient is about telling the classes apart, none about the rest of the vocabulary. Each
sample's loss depends on that sample only.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

Reduction = Literal["sum", "mean"]
IGNORE_INDEX = -100


def token_losses(
    logits: Tensor, labels: Tensor, reduction: Reduction = "sum", ignore_index: int = IGNORE_INDEX
) -> Tensor:
    """Per-sample losses (B,) from logits (B, T, V) and targets aligned with them (B, T)."""
    if reduction not in ("sum", "mean"):
        raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")
    mask = labels != ignore_index
    flat = logits.reshape(-1, logits.shape[-1])
    nll = F.cross_entropy(flat, labels.reshape(-1), ignore_index=ignore_index, reduction="none")
    total = nll.reshape(labels.shape).sum(1)
    if reduction == "mean":
        total = total / mask.sum(1).clamp(min=1).to(total.dtype)
    return total


def causal_lm_labels(batch: Mapping[str, Tensor], ignore_index: int = IGNORE_INDEX) -> Tensor:
    """Next-token targets (B, T) aligned with the logits: position t holds ``labels[t+1]`` (default
    ``input_ids``), ``ignore_index`` where that token is masked by ``attention_mask`` and at the last position."""
    labels = batch.get("labels", batch["input_ids"])
    mask = batch.get("attention_mask")
    if mask is not None:
        labels = labels.masked_fill(mask == 0, ignore_index)
    return torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], ignore_index)], 1)


def _accepts_position_ids(model: nn.Module) -> bool:
    get_base_model = getattr(model, "get_base_model", None)  # a peft model: inspect the model it wraps
    base: nn.Module = model if get_base_model is None else get_base_model()
    return "position_ids" in inspect.signature(base.forward).parameters


def causal_lm_losses(
    model: nn.Module, batch: Mapping[str, Tensor], reduction: Reduction = "sum", ignore_index: int = IGNORE_INDEX
) -> Tensor:
    """Per-sample losses (B,) of a Hugging Face causal LM on ``batch`` (input_ids, attention_mask, labels)."""
    logits = model(**model_inputs(model, batch)).logits
    return token_losses(logits, causal_lm_labels(batch, ignore_index), reduction, ignore_index)


def model_inputs(model: nn.Module, batch: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """The model's inputs from ``batch``: input_ids, attention_mask and position ids 0..T−1 per sample (B, T)
    when the model accepts them (right padding), so that position-embedding layers see a batch dimension
    and their per-sample gradients stay separable."""
    inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "position_ids")}
    if "position_ids" not in inputs and _accepts_position_ids(model):
        batch_size, seq_len = inputs["input_ids"].shape
        positions = torch.arange(seq_len, device=inputs["input_ids"].device)
        inputs["position_ids"] = positions.expand(batch_size, seq_len)
    return inputs


def label_word_targets(labels: Tensor, label_ids: Tensor, ignore_index: int = IGNORE_INDEX) -> tuple[Tensor, Tensor]:
    """Where each row's label word is predicted and which class it is, from prompt targets.

    ``labels`` (B, T) holds the label-word tokens at their own positions and ``ignore_index`` elsewhere
    (:func:`privlm.lm.prompts.collate`); ``label_ids`` (K,) are the classes' first label-word tokens.
    Returns ``positions`` (B,): the position whose logits predict the first label-word token (one before
    it), and ``classes`` (B,): the index in ``label_ids`` of that token."""
    targeted = labels != ignore_index
    if not bool(targeted.any(1).all()):
        raise ValueError("every row needs a label word (a target token)")
    first = targeted.int().argmax(1)
    tokens = labels.gather(1, first[:, None])
    matches = tokens == label_ids[None, :]
    if not bool(matches.any(1).all()):
        raise ValueError("a row's first target token is not one of the label words' first tokens")
    return first - 1, matches.int().argmax(1)


def label_word_losses(class_logits: Tensor, classes: Tensor) -> Tensor:
    """Per-sample K-way cross-entropy (B,): −log softmax(class_logits)[class] over the K label words only,
    from ``class_logits`` (B, K) and ``classes`` (B,)."""
    return F.cross_entropy(class_logits, classes, reduction="none")


def label_word_lm_losses(model: nn.Module, batch: Mapping[str, Tensor], label_ids: Tensor) -> Tensor:
    """The label-word objective of a causal LM classifier (B,): the K-way cross-entropy over the logits of
    the label words' first tokens ``label_ids`` (K,) at the position that predicts them. Every use of a
    weight goes through the model's own layers (hooks see the full output layer)."""
    logits = model(**model_inputs(model, batch)).logits
    positions, classes = label_word_targets(batch["labels"], label_ids)
    rows = torch.arange(logits.shape[0], device=logits.device)
    return label_word_losses(logits[rows, positions][:, label_ids], classes)
