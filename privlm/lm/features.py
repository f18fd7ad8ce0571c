"""Hidden-state features of texts: the final hidden state at the last token, or mean-pooled, in fixed public shapes.

Used by the coreset baselines, Private Evolution's embeddings and the experiment runner's pool features.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.errors import UserError
from privlm.lm.prompts import pad_token_id
from privlm.resources.padding import padded_batch, shape_buckets


def last_token_features(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    batch_size: int = 16,
    max_length: int = 128,
) -> np.ndarray:
    """Final hidden state (after the final norm) at each text's last real token, ``(len(texts), hidden)``:
    :func:`hidden_features` with ``pooling="last"``."""
    return hidden_features(model, tokenizer, texts, "last", batch_size, max_length)


def hidden_features(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    texts: Sequence[str],
    pooling: str = "last",
    batch_size: int = 16,
    max_length: int = 128,
    fixed_shape: bool = False,
) -> np.ndarray:
    """Final hidden states (after the final norm) of each text, ``(len(texts), hidden)``, float64: at the
    last real token (``pooling="last"``) or averaged over the real tokens (``"mean"``).

    Computed by the model's backbone (``model.base_model``), without the LM head. Right padding with an
    attention mask; texts longer than ``max_length`` tokens keep their end. ``fixed_shape``: every batch
    is ``batch_size`` rows of a public width chosen by each text's own length (private texts: a text's
    features then do not depend on which others share its batch, :func:`privlm.resources.padding.shape_buckets`).
    """
    if pooling not in ("last", "mean"):
        raise UserError(f"pooling must be 'last' or 'mean', got {pooling!r}")
    encoded = [tokenizer(t, add_special_tokens=True)["input_ids"][-max_length:] for t in texts]
    if any(len(ids) == 0 for ids in encoded):
        raise UserError("a text encodes to no tokens; cannot take its hidden-state features")
    pad = pad_token_id(tokenizer)
    if fixed_shape:
        batches = shape_buckets([len(ids) for ids in encoded], batch_size, max_length)
    else:
        batches = [
            (list(range(s, min(s + batch_size, len(encoded)))), None) for s in range(0, len(encoded), batch_size)
        ]
    out: np.ndarray | None = None  # (len(texts), width of the backbone's output), allocated at the first batch
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            for indices, width in batches:
                chunk = [encoded[i] for i in indices]
                ids, mask, lengths = padded_batch(chunk, pad, width=width, rows=batch_size if fixed_shape else None)
                hidden = model.base_model(input_ids=ids, attention_mask=mask).last_hidden_state[
                    : len(chunk)
                ]  # no LM head
                if pooling == "mean":
                    weights = mask[: len(chunk)].to(hidden.dtype)[:, :, None]
                    pooled = ((hidden * weights).sum(1) / weights.sum(1)).double().numpy()
                else:
                    pooled = hidden[torch.arange(len(chunk)), lengths - 1].double().numpy()
                if out is None:
                    out = np.zeros((len(encoded), pooled.shape[1]))
                out[indices] = pooled
    finally:
        model.train(was_training)
    return out if out is not None else np.zeros((0, model.config.hidden_size))
