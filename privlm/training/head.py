"""Head-only classification: train only the label-word rows of a causal LM's output layer.

For a verbalizer with label words w_1..w_K, the model's output layer already is a K-way classifier: the
logit of class c at the position that predicts the label word is h·W[t_c], with h the final (normed)
hidden state and t_c the first token of " w_c". :class:`LabelWordHead` trains those K rows (K × d
parameters, initialised from the model, so training starts at the zero-shot classifier) on the frozen
model's h. DP noise grows with the square root of the trainable dimension, which is K·d here (2,880 for
SmolLM2 on BBC News against 1.3 M for LoRA r = 8 on every layer): linear probing is the regime where
DP-SGD loses least.

The frozen model computes the same h for an example in every epoch, so h can be computed once
(:mod:`privlm.training.prefix_cache`); the head then accepts ``{"features": (B, d), "classes": (B,)}``
batches as well as token batches (``input_ids``, ``attention_mask``, ``labels``).

Scoring: the predicted class is argmax_c h·W[t_c]. For single-token label words (every built-in
verbalizer with SmolLM2's tokenizer) this is exactly the label-word scoring of the model with these
rows in its output layer (log-softmax over the vocabulary shifts every class by the same amount); for
multi-token words the head is a classifier on the first tokens.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor, nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from privlm.dpsgd.losses import label_word_losses, label_word_targets, model_inputs
from privlm.errors import UserError
from privlm.lm.prompts import split_prompt
from privlm.resources.verbalizers import Verbalizer


def label_token_ids(tokenizer: PreTrainedTokenizerBase, verbalizer: Verbalizer) -> list[int]:
    """The first token of each label word as it follows the prompt (with its leading space), one per class.

    Raises :class:`UserError` when two classes share a first token (the K-way objective could not tell
    them apart). The ids do not depend on the text: context and label word are tokenized separately."""
    ids = []
    for word in verbalizer.label_words:
        _, continuation = split_prompt("", verbalizer.template, word)
        tokens = tokenizer(continuation, add_special_tokens=False)["input_ids"]
        if not tokens:
            raise UserError(f"label word {word!r} encodes to no tokens")
        ids.append(int(tokens[0]))
    if len(set(ids)) < len(ids):
        raise UserError(
            f"label words {list(verbalizer.label_words)} share a first token; the label-word objective "
            "needs label words that start with distinct tokens"
        )
    return ids


def label_word_rows(model: PreTrainedModel, label_ids: Sequence[int]) -> Tensor:
    """A copy of the output layer's rows for ``label_ids`` (K, d): the model's own K-way label-word classifier.
    :class:`UserError` for an output layer with a bias (the rows alone would not be the classifier)."""
    output = model.get_output_embeddings()
    if output is None or getattr(output, "bias", None) is not None:
        raise UserError(f"{type(model).__name__}: the label-word head needs an output layer without bias")
    return output.weight.detach()[torch.as_tensor(list(label_ids), dtype=torch.long)].clone()


class LabelWordHead(nn.Module):
    """A frozen causal LM (``model``) and a trainable K × d copy of its output rows for ``label_ids`` (``rows``).

    ``forward(batch)`` returns class logits (B, K): from ``batch["features"]`` (B, d) when given (cached
    hidden states), else from the frozen model run on the token batch."""

    def __init__(self, model: PreTrainedModel, label_ids: list[int]) -> None:
        super().__init__()
        weight = label_word_rows(model, label_ids)
        model.requires_grad_(False)
        model.eval()
        self.model = model
        self.register_buffer("label_ids", torch.tensor(label_ids, dtype=torch.long))
        self.rows = nn.Linear(weight.shape[1], weight.shape[0], bias=False, dtype=weight.dtype)
        with torch.no_grad():
            self.rows.weight.copy_(weight)

    def train(self, mode: bool = True) -> LabelWordHead:
        """Only the head changes mode; the frozen model stays in eval mode (no dropout: its features are
        the same in every epoch, which is what makes them cacheable)."""
        self.training = mode
        self.rows.train(mode)
        return self

    def features(self, batch: Mapping[str, Tensor], examples: int | None = None) -> Tensor:
        """The frozen model's final hidden state (B, d) at the position predicting each row's label word.

        ``examples``: only the first ``examples`` rows are examples (B = ``examples``); the rest are filler
        rows of a fixed-shape batch (:func:`privlm.lm.prompts.collate` with ``rows``), run with the
        batch so that its shape is the one asked for, and dropped."""
        return self.features_and_classes(batch, examples)[0]

    def features_and_classes(self, batch: Mapping[str, Tensor], examples: int | None = None) -> tuple[Tensor, Tensor]:
        """Features (B, d) and gold classes (B,): given in cached batches, else through the frozen model
        and read off the label word (located once); ``examples`` as in :meth:`features`."""
        if "features" in batch:
            return batch["features"], batch["classes"]
        positions, classes = label_word_targets(batch["labels"][:examples], self.label_ids)
        with torch.no_grad():
            hidden = self.model.base_model(**model_inputs(self.model, batch)).last_hidden_state
        return hidden[torch.arange(positions.shape[0], device=hidden.device), positions], classes

    def forward(self, batch: Mapping[str, Tensor]) -> Tensor:
        features = batch["features"] if "features" in batch else self.features(batch)
        return self.rows(features.to(self.rows.weight.dtype))


def head_losses(head: LabelWordHead, batch: Mapping[str, Tensor]) -> Tensor:
    """Per-sample K-way cross-entropy of the head (B,) — the ``loss_fn`` of a head-only run."""
    features, classes = head.features_and_classes(batch)
    return label_word_losses(head({"features": features}), classes)
